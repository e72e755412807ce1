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

from goodput.tiers.checksum import file_xxh3_128
from goodput.tiers.manifest import MANIFEST_NAME, InvalidManifest, parse_manifest
from goodput_services.replicator.records import (
    CopyRecord,
    FileRef,
    Tier,
    copy_key,
    local_root,
    peer_root,
)

STEP_PREFIX = "step-"


def node_dir(state_dir: Path, node: str) -> Path:
    """Everything a node stores; its peer server serves this directory."""
    return Path(state_dir) / "nodes" / node


def step_of(name: str) -> int | None:
    digits = name.removeprefix(STEP_PREFIX)
    if name.startswith(STEP_PREFIX) and len(digits) == 10 and digits.isdigit():
        return int(digits)
    return None


def verify_copy(directory: Path) -> tuple[list[FileRef], str]:
    """(files, "") if every file matches the manifest, else ([], the problem)."""
    try:
        manifest = parse_manifest((directory / MANIFEST_NAME).read_bytes())
    except (OSError, InvalidManifest) as exc:
        return [], f"{directory}: unreadable manifest ({exc})"
    if manifest.step != step_of(directory.name):
        return [], f"{directory}: manifest says step {manifest.step}"
    files = []
    for entry in manifest.files:
        path = directory / entry.name
        try:
            if path.stat().st_size != entry.size:
                return [], f"{path}: size differs from the manifest"
            if file_xxh3_128(path) != entry.xxh3_128:
                return [], f"{path}: checksum differs from the manifest"
        except OSError as exc:
            return [], f"{path}: {exc.strerror or exc}"
        files.append(FileRef(entry.name, entry.size, entry.xxh3_128))
    return files, ""


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

    def _places(self) -> list[tuple[Tier, str, str]]:
        """(tier, owner, root relative to the node dir) of every checkpoint parent directory."""
        places: list[tuple[Tier, str, str]] = [("local", self.node, local_root(self.job))]
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
                step = step_of(name)
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

    def age_s(self, record: CopyRecord) -> float:
        """Seconds since this node first saw the copy (how long it has waited for peers)."""
        seen = self._seen.get(self.directory / record.root / f"{STEP_PREFIX}{record.step:010d}")
        return time.monotonic() - seen.first_seen if seen else 0.0
