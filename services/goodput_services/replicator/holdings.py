"""What one node's disk holds: its own checkpoints and the copies it keeps for peers.

A committed checkpoint directory is reported only once it has been checked, and how it is
checked depends on what is already known about its bytes:

- ``hashed``: every file read and compared with the manifest's digest. What the start-up
  pass does (nothing is known about what was on disk before), what every scrub does
  (``scrub_interval_s``: bit rot, tampering), and the fallback for anything else.
- ``sealed``: this node's own checkpoint, first seen after the start-up pass: the engine
  hashed each file as it wrote it and sealed the digests in the manifest, which appears
  only after the data is durable. The seal and every file's size are checked.
- ``received``: a copy the node's peer server verified, file by file, as it arrived
  (``PeerServer.received``) against the manifest it holds now. Sizes are checked again.

A copy with a missing, short or (when hashed) corrupt file is never reported, so the index
cannot count it toward a complete step. A part of a checkpoint sharded across nodes is
reported with its part, part count and commit id (its manifest, checked against its commit
table when parsed); the parts staged for a reshard (``step-N.part-K``) are no step directory
and are not reported: they are restore material, not copies.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from goodput.checkpoint.format import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    Signature,
    check_sealed,
    local_root,
    parse_step_dir,
    peer_root,
    read_manifest,
    step_dir,
    verify_manifest_and_files,
)
from goodput.checkpoint.index.records import CopyRecord, FileRef, copy_key, part_fields
from goodput.schemas.tiers import LOCAL, PEER, StorageTier

#: how a copy was checked before it was reported (see the module's docstring)
Check = Literal["hashed", "sealed", "received"]


def _checked_manifest(directory: Path, read_data: bool) -> tuple[Manifest | None, str]:
    """(the manifest, "") if the copy checks out, else (None, the problems)."""
    if read_data:
        manifest, problems = verify_manifest_and_files(directory)
    else:
        manifest, problems = check_sealed(directory)
    if manifest is None or problems:
        return None, f"{directory}: " + "; ".join(map(str, problems))
    return manifest, ""


def file_refs(manifest: Manifest) -> list[FileRef]:
    return [FileRef(e.name, e.size, e.xxh3_128) for e in manifest.files]


def verify_copy(directory: Path, *, read_data: bool = True) -> tuple[list[FileRef], str]:
    """(files, "") if the copy checks out, else ([], the problems). ``read_data``: hash
    every file; otherwise only the manifest's seal and the files' sizes are checked."""
    manifest, problem = _checked_manifest(directory, read_data)
    return (file_refs(manifest), "") if manifest is not None else ([], problem)


@dataclass
class _Seen:
    signature: Signature
    verified_at: float
    record: CopyRecord | None
    problem: str
    first_seen: float


@dataclass
class Scan:
    """One pass over the disk: what is held, what is wrong, and what was checked now."""

    held: dict[str, CopyRecord] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    checked: list[tuple[CopyRecord, Check]] = field(default_factory=list)


class DiskHoldings:
    """Scans ``<node dir>/checkpoints/<job>`` and ``<node dir>/peer/<job>/<owner>``.

    ``received``: the peer server's copies verified on receive (entries are taken as they
    are used); ``trust``: False hashes every new copy (the behaviour before issue 26).
    """

    def __init__(
        self,
        directory: Path,
        job: str,
        node: str,
        scrub_interval_s: float,
        *,
        received: dict[Path, str] | None = None,
        trust: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.job = job
        self.node = node
        self.scrub_interval_s = scrub_interval_s
        self.received = received if received is not None else {}
        self.trust = trust
        self._started = False  # the first scan is the start-up pass
        self._seen: dict[Path, _Seen] = {}

    def _places(self) -> list[tuple[StorageTier, str, str]]:
        """(tier, owner, root relative to the node dir) of every checkpoint parent directory."""
        places: list[tuple[StorageTier, str, str]] = [(LOCAL, self.node, local_root(self.job))]
        peers = self.directory / "peer" / self.job
        if peers.is_dir():
            for owner in sorted(os.listdir(peers)):
                if not owner.startswith(".") and (peers / owner).is_dir():
                    places.append((PEER, owner, peer_root(self.job, owner)))
        return places

    def _check(self, tier: StorageTier, directory: Path) -> Check:
        """How a new (or changed) copy is checked: hashed unless its bytes were hashed
        against this very manifest as they were written (by the engine) or received."""
        seal = self.received.pop(directory, None)
        if not self.trust or not self._started:
            return "hashed"
        if tier == LOCAL:
            return "sealed"
        try:
            same = seal is not None and read_manifest(directory).manifest_xxh3_128 == seal
        except ManifestError:
            same = False  # hashing reports the problem
        return "received" if same else "hashed"

    def scan(self) -> Scan:
        """Checked copies by index key, the problems found since the last scan, and the
        copies checked in this pass."""
        now = time.monotonic()
        result = Scan()
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
                if seen is None or stale or now - seen.verified_at > self.scrub_interval_s:
                    how = self._check(tier, directory) if stale else "hashed"
                    manifest, problem = _checked_manifest(directory, how == "hashed")
                    record = None
                    if manifest is not None:
                        record = CopyRecord(
                            step=step,
                            tier=tier,
                            holder=self.node,
                            owner=owner,
                            root=root,
                            files=file_refs(manifest),
                            verified_ts=time.time_ns(),
                            **part_fields(manifest.part),
                        )
                        if stale:
                            result.checked.append((record, how))
                    if problem and (seen is None or seen.problem != problem):
                        result.problems.append(problem)
                    first = now if seen is None else seen.first_seen
                    seen = self._seen[directory] = _Seen(signature, now, record, problem, first)
                if seen.record is not None:
                    result.held[copy_key(self.job, seen.record)] = seen.record
        for gone in set(self._seen) - present:
            del self._seen[gone]
        for directory in [d for d in self.received if not d.exists()]:
            self.received.pop(directory, None)  # deleted before any scan saw it
        self._started = True
        return result

    def distrust(self, directory: Path) -> None:
        """Hash ``directory`` in full at the next scan: a reader found a file that does not
        match its digest (a peer receiving it, a backup), so the trust by size was wrong."""
        seen = self._seen.get(directory)
        if seen is not None:
            seen.verified_at = float("-inf")

    def first_seen(self, record: CopyRecord) -> float | None:
        """When (monotonic) this node first saw the copy: how long it has waited for peers."""
        seen = self._seen.get(step_dir(self.directory / record.root, record.step))
        return seen.first_seen if seen else None
