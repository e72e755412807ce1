"""goodput in the training frameworks people use, each a small module with its own extra:

- :mod:`goodput.integrations.loop`: a plain loop (torchtitan-style scripts), torch only;
- :mod:`goodput.integrations.lightning`: a PyTorch Lightning ``Callback`` (``goodput[lightning]``);
- :mod:`goodput.integrations.hf_trainer`: a Hugging Face ``TrainerCallback`` (``goodput[hf]``).

Each skips a loss spike's windows of batches in its framework's own loop
(:mod:`~goodput.integrations.lightning_skip`, :mod:`~goodput.integrations.hf_skip`).
"""
