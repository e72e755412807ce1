"""What one node's disk holds: its own checkpoints and the copies it keeps for peers.

Every committed checkpoint directory is fully hashed when first seen (and again every
``scrub_interval_s``) before it is reported; a copy with a missing, short or corrupt file
is never reported, so the index cannot count it toward a complete step.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from goodput.ckptfmt import (
    MANIFEST_NAME,
    local_root,
    parse_step_dir,
    peer_root,
    step_dir,
    verify_manifest_and_files,
)
from goodput.ckptindex.records import CopyRecord, FileRef, copy_key
from goodput.schemas.events import StorageTier


def verify_copy(directory: Path) -> tuple[list[FileRef], str]:
    """(files, "") if every file matches the manifest, else ([], the problems)."""
    manifest, problems = verify_manifest_and_files(directory)
    if manifest is None or problems:
        return [], f"{directory}: " + "; ".join(map(str, problems))
    return [FileRef(e.name, e.size, e.xxh3_128) for e in manifest.files], ""


@dataclass
class _Seen:
    signature: tuple[int, int, int]
    verified_at: float
    record: CopyRecord | None
    problem: str
    first_seen: float


class DiskHoldings:
    """Scans ``<node dir>/checkpoints/<job>`` and ``<node dir>/peer/<job>/<owner>``."""

    def __init__(self, directory: Path, job: str, node: str, scrub_interval_s: float) -> None:
        self.directory = Path(directory)
        self.job = job
        self.node = node
        self.scrub_interval_s = scrub_interval_s
        self._seen: dict[Path, _Seen] = {}

    def _places(self) -> list[tuple[StorageTier, str, str]]:
        """(tier, owner, root relative to the node dir) of every checkpoint parent directory."""
        places: list[tuple[StorageTier, str, str]] = [("local", self.node, local_root(self.job))]
        peers = self.directory / "peer" / self.job
        if peers.is_dir():
            for owner in sorted(os.listdir(peers)):
                if not owner.startswith(".") and (peers / owner).is_dir():
                    places.append(("peer", owner, peer_root(self.job, owner)))
        return places

    def scan(self) -> tuple[dict[str, CopyRecord], list[str]]:
        """Verified copies by index key, and the problems found since the last scan."""
        now = time.monotonic()
        held: dict[str, CopyRecord] = {}
        problems: list[str] = []
        present: set[Path] = set()
        for tier, owner, root in self._places():
            parent = self.directory / root
            try:
                names = os.listdir(parent)
            except FileNotFoundError:
                continue
            for name in names:
                step = parse_step_dir(name)
                if step is None:
                    continue  # being written or deleted (hidden names), or not a checkpoint
                directory = parent / name
                try:
                    stat = (directory / MANIFEST_NAME).stat()
                except OSError:
                    continue  # not committed (yet)
                present.add(directory)
                signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                seen = self._seen.get(directory)
                stale = seen is None or seen.signature != signature
                if stale or now - seen.verified_at > self.scrub_interval_s:
                    files, problem = verify_copy(directory)
                    record = None
                    if not problem:
                        record = CopyRecord(
                            step=step,
                            tier=tier,
                            holder=self.node,
                            owner=owner,
                            root=root,
                            files=files,
                            verified_ts=time.time_ns(),
                        )
                    if problem and (seen is None or seen.problem != problem):
                        problems.append(problem)
                    first = now if seen is None else seen.first_seen
                    seen = self._seen[directory] = _Seen(signature, now, record, problem, first)
                if seen.record is not None:
                    held[copy_key(self.job, seen.record)] = seen.record
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return held, problems

    def first_seen(self, record: CopyRecord) -> float | None:
        """When (monotonic) this node first saw the copy: how long it has waited for peers."""
        seen = self._seen.get(step_dir(self.directory / record.root, record.step))
        return seen.first_seen if seen else None
