"""``ranks-<job>.json``: the pids of the local backend's ranks and standbys, per node.

The actuator's local backend writes it at every change of its ranks, so that `goodput down`
stops them even when the actuator itself was killed, and chaos finds them when the bus is away
(:meth:`goodput.state_dir.StateDir.ranks_record` names the file). Whoever reads it trusts no
pid in it: a pid is signalled only if its process carries the stack's marker
(:mod:`goodput.owned_process`), or, for chaos, the job's own environment.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from goodput.owned_process import RecordUnreadable

#: node name -> the pids of its ranks (in rank order), then its standbys
RankPids = dict[str, list[int]]


def write_rank_pids(path: Path, pids: RankPids) -> None:
    """Replace the record at once: a reader never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(pids))
    os.replace(tmp, path)


def read_rank_pids(path: Path) -> RankPids:
    """The recorded pids ({} if there is no record); raises :class:`RecordUnreadable` (one
    line) if it cannot be decoded."""
    if not path.exists():
        return {}
    try:
        return msgspec.json.decode(path.read_bytes(), type=RankPids)
    except msgspec.DecodeError as exc:
        raise RecordUnreadable(f"the ranks file {path} is unreadable ({exc})") from None
