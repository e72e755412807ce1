"""Where a rank's output goes on a host: written by whoever starts the rank (the local backend,
a node agent), read by ``goodput run`` when a launch fails."""

from __future__ import annotations

from pathlib import Path

from goodput.state_dir import StateDir


def rank_log_dir(state_dir: Path, attempt: int) -> Path:
    """Where the output of ``attempt``'s ranks is kept."""
    return StateDir(state_dir).rank_logs(attempt)


def rank_log_name(node: str, rank: int) -> str:
    return f"{node}-rank{rank}.log"


def rank_log(state_dir: Path, attempt: int, node: str, rank: int) -> Path:
    """What a rank of ``attempt`` printed (stdout and stderr)."""
    return rank_log_dir(state_dir, attempt) / rank_log_name(node, rank)
