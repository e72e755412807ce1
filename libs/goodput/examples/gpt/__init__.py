"""A small GPT trained on the CPU with DDP: the example job that goodput supervises.

Its whole training state (model, optimizer, LR schedule, RNG states, data position) can be
checkpointed and resumed bit-exactly at the same world size, and resumed at another world size
with the same global batch (gradient accumulation), so restarts, hot swaps and rescales can be
checked by comparing parameter hashes.
"""

from __future__ import annotations

import sys

#: the module a supervisor starts as the example job (``python -m``)
SUPERVISED = "goodput.examples.gpt.supervised"


def supervised_argv(steps: int, *options: str) -> list[str]:
    """The command line of the example job under supervision, in this interpreter, for
    ``steps`` steps with ``options`` after them, its per-step log off: what a ``StartJob``
    of a bench, the demo or a test runs (importing no torch to say it)."""
    return [sys.executable, "-m", SUPERVISED, "--steps", str(steps), "--log-every", "0", *options]
