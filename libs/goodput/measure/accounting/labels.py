"""The short words a report puts on its timeline: what a fault was, which rule remedied it.

Built from the events alone (a ``Signal``'s kind and whom it names, a ``Decision``'s rule),
never from who ran the job, so a report of any run reads the same. Every piece of text comes
from the bus and may be forged: it is cut to printable characters and ``MAX_LABEL_CHARS``.
"""

from __future__ import annotations

from goodput import schemas

#: a label's most characters: it is drawn rotated beside its marker, one line
MAX_LABEL_CHARS = 28

#: each signal kind in a person's words (the kinds are ``schemas.SignalKind``'s)
SIGNAL_WORDS: dict[schemas.SignalKind, str] = {
    "crash": "crash",
    "hang": "hang",
    "missed_heartbeat": "silent",
    "straggler": "straggler",
    "degraded_host": "host fault",
    "job_down": "job down",
    "node_returned": "node back",
    "nonfinite": "NaN/Inf",
    "loss_spike": "loss spike",
    "replica_mismatch": "SDC (replica mismatch)",
}

#: a crash's CUDA cause (``Signal.rank_fault``) in words
_RANK_FAULT_WORDS: dict[schemas.RankFault, str] = {
    "": "crash",
    "cuda-context": "CUDA error",
    "cuda-oom": "GPU OOM",
}


def clean(text: str) -> str:
    """``text`` as one printable line of at most ``MAX_LABEL_CHARS`` (an ellipsis if cut)."""
    line = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return line if len(line) <= MAX_LABEL_CHARS else line[: MAX_LABEL_CHARS - 1] + "…"


def fault_label(signal: schemas.Signal) -> str:
    """What went wrong, and where: ``crash rank 1``, ``node lost n1``, ``NaN/Inf``."""
    kind = signal.signal
    words = SIGNAL_WORDS.get(kind, kind)
    if kind == "crash":
        words = _RANK_FAULT_WORDS.get(signal.rank_fault, "crash")
        if signal.rank is None and not signal.node:
            words += " (all ranks)"  # a job-wide fault names no node (schemas.Signal)
    elif kind == "missed_heartbeat" and signal.rank is None:
        words = "node lost"  # every rank of the node silent and no host report
    if signal.rank is not None and kind in ("crash", "hang", "missed_heartbeat"):
        return clean(f"{words} rank {signal.rank}")
    if signal.node and kind not in schemas.NUMERICAL_SIGNALS and kind != "job_down":
        return clean(f"{words} {signal.node}")
    return clean(words)


def exit_label(exited: schemas.RankExited) -> str:
    """A rank's unexpected exit that no signal explained."""
    return clean(f"exit rank {exited.rank}")


def remedy_label(decision: schemas.Decision) -> str:
    """The rule the controller chose, as its ``Decision`` names it (``in-process-restart``)."""
    return clean(decision.rule or decision.policy)
