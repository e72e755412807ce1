"""Export a goodput checkpoint into other tools' formats (``goodput ckpt export``).

- :mod:`~goodput.checkpoint.export.sources`: which step directories make one checkpoint (one
  directory, or every part of one commit), checked against their manifests and commit table.
- :mod:`~goodput.checkpoint.export.dcp`: write it as a torch.distributed.checkpoint (DCP)
  checkpoint with DCP's own writer, every byte verified on the way.
"""
