"""How the ranks of a job settle on one checkpoint to restore, and never on different ones.

Each rank restores the newest intact checkpoint at or before a candidate step; one whose copy
of that step cannot be read (a corrupt file, or a step sharded across nodes whose part for
some node nobody holds) falls back to an older step on its own. The ranks then compare what
they loaded in one all-reduce (the smallest and the largest step): equal, every rank holds
the same step; otherwise every rank restores again at the smallest. Every rank decides from
the same two numbers (:func:`judge`, pure), so all leave in the same round: a rank leaving
early waits in its next collective for peers still restoring (the hang seen after a
scale-down, when one rank could read the newest step from its own part and the others could
not). The candidate drops in every round that does not end it, so the rounds are bounded by
the steps on the volumes (and by :data:`MAX_ROUNDS`).

A rank that can restore nothing at or before the candidate while checkpoints exist makes
every rank refuse in one line: starting over from step 0 would throw the job's progress away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from goodput.checkpoint.engine import NoCheckpointError
from goodput.shim.agree import agree_range
from goodput.shim.restore_result import UnfilledVolumeError, UnrestorableCheckpointError

log = logging.getLogger(__name__)

#: restore rounds before the ranks give up agreeing (each round lowers the candidate step)
MAX_ROUNDS = 8

Loaded = TypeVar("Loaded", bound=tuple[int, Any, Any])


@dataclass(frozen=True)
class Agreed:
    """Every rank loaded ``step``."""

    step: int


@dataclass(frozen=True)
class Retry:
    """The ranks loaded different steps: every rank restores ``step`` (the smallest) again."""

    step: int


@dataclass(frozen=True)
class Refuse:
    """Some rank restored nothing at or before the candidate: no step every rank holds."""

    reason: str


def judge(candidate: int, low: int | None, high: int | None) -> Agreed | Retry | Refuse:
    """What every rank does after restoring ``candidate``, from the smallest (``low``, None:
    some rank loaded nothing) and largest step the ranks loaded."""
    if low is None:
        return Refuse(f"a rank could restore no intact checkpoint at or before step {candidate}")
    if low == high:
        return Agreed(low)
    return Retry(low)


def _one_line(exc: NoCheckpointError) -> str:
    head = str(exc).splitlines()[0]
    return "; ".join([head, *(f"step {f.step}: {f.reason}" for f in exc.fallbacks)])


def restore_agreed(
    latest: int | None, load: Callable[[int], Loaded], *, rank: int, where: str
) -> Loaded | None:
    """The checkpoint every rank restored, the same step on all (``load(step)`` restores the
    newest intact one at or before ``step``; its result starts with the step it loaded).
    None only when no rank holds any checkpoint (``latest``: this rank's newest)."""
    low, high = agree_range(latest)
    if high is None:
        return None
    if low is None:
        raise UnfilledVolumeError(
            f"rank {rank} "
            + (f"holds step {latest}" if latest is not None else "holds no checkpoint")
            + f" in {where}, and some ranks "
            + ("hold none" if latest is not None else "hold one")
            + ": a node's volume was not filled before the launch; refusing to start "
            "over from step 0 (restore it: goodput ckpt restore)"
        )
    candidate = low
    for _ in range(MAX_ROUNDS):
        loaded: Loaded | None
        failure = ""
        try:
            loaded = load(candidate)
        except NoCheckpointError as exc:
            loaded, failure = None, _one_line(exc)
        low, high = agree_range(None if loaded is None else loaded[0])
        match judge(candidate, low, high):
            case Agreed():
                return loaded
            case Retry(step):
                log.info(
                    "the ranks restored steps %s to %s at or before step %d; every rank "
                    "restores step %d",
                    low,
                    high,
                    candidate,
                    step,
                )
                candidate = step
            case Refuse(reason):
                raise UnrestorableCheckpointError(
                    f"rank {rank}: {failure or reason} (in {where}); refusing to start over "
                    "from step 0 while checkpoints exist (goodput ckpt ls shows them)"
                )
    raise UnrestorableCheckpointError(
        f"rank {rank}: the ranks restored no common step in {MAX_ROUNDS} rounds (in {where})"
    )
