"""The global commit of a checkpoint saved as one part per node (``format.parts``).

Each node's leader (its first local rank) reports its part's :class:`PartSummary` once every
file of the part is durable; the coordinator (global rank 0) waits for every part's report,
checks that they agree, and publishes the commit table (or why there is none); each leader
then writes its part's manifest with that table and renames its part to ``step-N``. A part
whose leader never gets the table stays a temporary directory: never restorable.

The transport is the process group's key-value store (``torch.distributed.Store``, e.g. the
default group's TCPStore), not a collective: it runs on the engine's persist thread while the
trainer's collectives go on, and it works whatever the backend. Keys live under
``goodput/parts/<namespace>/step-N/`` (the namespace names the job and its attempt, so a
restarted job never reads an older attempt's keys). The coordinator deletes them once every
leader has read the table, and only then returns: a job that ends right after its last save
still commits every part.

Cost at 2,048 nodes x 8 ranks: 2,048 reports of 174 bytes into the coordinator (one
``multi_get``), and a table of 281 KB read once by each leader (~575 MB out of the store's
server per checkpoint, spread over the leaders' polls), all on persist threads, off the
training path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from goodput.checkpoint.format.parts import MAX_PARTS, PartOf, PartSummary

#: the first poll of a key comes this soon; later ones back off to ``_POLL_MAX_S``
_POLL_MIN_S = 0.01
_POLL_MAX_S = 0.5
#: a leader waits this much longer for the table than the coordinator waits for reports
_TABLE_GRACE_S = 30.0


class KeyStore(Protocol):
    """What the commit needs of a ``torch.distributed.Store``."""

    def set(self, key: str, value: bytes) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def multi_get(self, keys: list[str]) -> list[bytes]: ...
    def add(self, key: str, amount: int) -> int: ...
    def delete_key(self, key: str) -> bool: ...


@dataclass(frozen=True)
class PartLayout:
    """Where a rank's shards go when a sharded state spans nodes: its node's part.

    Ranks are numbered node by node (``rank = part * local_world + local_rank``, as torchrun
    and goodput's launchers number them). ``store``: the key-value store every rank reaches;
    None takes the default process group's (a fresh client per save, so it follows a process
    group re-created after an in-process restart). ``namespace`` names the job and attempt."""

    part: int
    parts: int
    rank: int
    world: int
    local_rank: int
    local_world: int
    namespace: str
    store: KeyStore | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not 1 <= self.parts <= MAX_PARTS or not 0 <= self.part < self.parts:
            raise ValueError(f"part {self.part} of {self.parts} parts")
        if (
            self.world != self.parts * self.local_world
            or not 0 <= self.local_rank < self.local_world
        ):
            raise ValueError(f"{self.world} ranks are not {self.parts} nodes x {self.local_world}")
        if self.rank != self.part * self.local_world + self.local_rank:
            raise ValueError(
                f"rank {self.rank} is not local rank {self.local_rank} of node {self.part}"
            )

    @property
    def leader(self) -> bool:
        """Writes the part's manifest (and the plain tensors, one copy per part)."""
        return self.local_rank == 0

    @property
    def node_ranks(self) -> list[int]:
        first = self.part * self.local_world
        return list(range(first, first + self.local_world))

    def key_store(self) -> KeyStore:
        if self.store is not None:
            return self.store
        from torch.distributed import distributed_c10d

        # torch has no public accessor of the default group's store; a clone is this
        # thread's own connection, so its polls never wait behind the trainer's store calls
        # (torch's stub of Store lacks clone, which its binding has)
        return distributed_c10d._get_default_store().clone()  # type: ignore[attr-defined]  # torch's Store stub lacks clone


class PartReport(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A leader's report: its part is durable, and the layout its ranks planned."""

    version: int = 1
    layout_digest: str
    summary: PartSummary


class CommitTable(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The coordinator's answer: the table of every part, or why there is none."""

    version: int = 1
    table: list[PartSummary] = []
    error: str = ""


class PartCommitError(RuntimeError):
    """No commit table for this part: the step's part must not become ``step-N``."""


def decide_table(reports: dict[int, PartReport], parts: int, world: int) -> list[PartSummary] | str:
    """The commit table from every part's report, or why the reports cannot be one."""
    missing = sorted(set(range(parts)) - set(reports))
    if missing:
        return f"parts {missing} did not report"
    digests = {report.layout_digest for report in reports.values()}
    if len(digests) != 1:
        return "the parts planned different state layouts"
    table = [reports[index].summary for index in range(parts)]
    if any(summary.part != index for index, summary in enumerate(table)):
        return "a part reported under another part's index"
    ranks = sorted(rank for summary in table for rank in summary.ranks)
    if ranks != list(range(world)):
        return f"the parts' ranks do not cover the {world} ranks exactly once"
    return table


def _namespace(layout: PartLayout, step: int) -> str:
    return f"goodput/parts/{layout.namespace}/step-{step:010d}"


def _wait(store: KeyStore, keys: list[str], deadline: float, now: Callable[[], float]) -> bool:
    """Poll until every key exists (True) or the deadline passes (False)."""
    pause = _POLL_MIN_S
    while not store.check(keys):
        if now() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, _POLL_MAX_S)
    return True


def _wait_count(
    store: KeyStore, key: str, count: int, deadline: float, now: Callable[[], float]
) -> None:
    """Poll until the counter ``key`` reaches ``count`` or the deadline passes."""
    pause = _POLL_MIN_S
    while store.add(key, 0) < count and now() <= deadline:
        time.sleep(pause)
        pause = min(pause * 2, _POLL_MAX_S)


def _coordinate(
    store: KeyStore, layout: PartLayout, prefix: str, now: Callable[[], float]
) -> tuple[CommitTable, int]:
    """The answer to publish, and how many leaders (this one included) wait for it."""
    keys = [f"{prefix}/report/{index}" for index in range(layout.parts)]
    deadline = now() + layout.timeout_s
    if not _wait(store, keys, deadline, now):
        late = [index for index, key in enumerate(keys) if not store.check([key])]
        error = f"parts {late} did not report within {layout.timeout_s:.0f} s"
        return CommitTable(error=error), layout.parts - len(late)
    reports: dict[int, PartReport] = {}
    for index, body in enumerate(store.multi_get(keys)):
        try:
            reports[index] = msgspec.json.decode(body, type=PartReport)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return CommitTable(error=f"part {index}'s report is malformed ({exc})"), layout.parts
    for key in keys:
        store.delete_key(key)
    decided = decide_table(reports, layout.parts, layout.world)
    if isinstance(decided, str):
        return CommitTable(error=decided), layout.parts
    return CommitTable(table=decided), layout.parts


def commit_part(
    layout: PartLayout,
    store: KeyStore,
    step: int,
    summary: PartSummary,
    layout_digest: str,
    now: Callable[[], float] = time.monotonic,
) -> PartOf:
    """A leader's side of the global commit (the coordinator's too, on global rank 0):
    report the durable part, get the table. Raises PartCommitError with the reason."""
    prefix = _namespace(layout, step)
    report = PartReport(layout_digest=layout_digest, summary=summary)
    store.set(f"{prefix}/report/{layout.part}", msgspec.json.encode(report))
    table_key, read_key = f"{prefix}/table", f"{prefix}/read"
    if layout.rank == 0:
        answer, waiting = _coordinate(store, layout, prefix, now)
        store.set(table_key, msgspec.json.encode(answer))
        # the job may end as soon as this part is renamed: first the table reaches every
        # leader (or the wait ends; a leader without it leaves its part unrenamed)
        _wait_count(store, read_key, waiting - 1, now() + layout.timeout_s, now)
        store.delete_key(table_key)
        store.delete_key(read_key)
    else:
        if not _wait(store, [table_key], now() + layout.timeout_s + _TABLE_GRACE_S, now):
            raise PartCommitError(
                f"no commit table from the coordinator (global rank 0) for step {step}"
            )
        body = store.get(table_key)
        store.add(read_key, 1)
        try:
            answer = msgspec.json.decode(body, type=CommitTable)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise PartCommitError(f"the commit table is malformed ({exc})") from exc
    if answer.error:
        raise PartCommitError(answer.error)
    if len(answer.table) != layout.parts or answer.table[layout.part] != summary:
        raise PartCommitError(f"the commit table does not hold part {layout.part} as written")
    return PartOf(part=layout.part, table=answer.table)
