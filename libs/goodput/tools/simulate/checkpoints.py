"""The simulated checkpoint system: when a save stalls training, when each tier holds it, and
which copy a restart restores from (the newest one a surviving tier held when the fault hit).

Three ways to save, as the strategies combine them: synchronous to one tier (training waits
for the whole write, the baseline's ``torch.save``: to the object store, or for the demo's
baseline to the node's disk), asynchronous to that tier (training waits for the snapshot
only), and multi-tier (snapshot, local volume, a peer's volume, and every k-th checkpoint the
object store), priced by the cost profile.

Which steps save is the shim's own schedule (:class:`goodput.shim.schedule.CheckpointSchedule`),
as every rank runs it: an interval command takes effect after the vote at the next agreement
step, and ranks started again (or restarted in process) begin from the job's launch interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from goodput.schemas.tiers import (
    HOST,
    LOCAL,
    NOTHING_RESTORED,
    OBJECT_STORE,
    PEER,
    STORAGE_TIERS,
    TIERS,
    RestoredFrom,
    StorageTier,
)
from goodput.shim.schedule import CheckpointSchedule
from goodput.tools.simulate.profile import CheckpointCosts

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Capture:
    step: int
    #: when training resumed after the snapshot (ns)
    taken_ns: int
    #: when each tier held it durably (ns); absent: never
    durable_ns: dict[str, int]


class CheckpointSystem:
    def __init__(
        self,
        costs: CheckpointCosts,
        state_gb: float,
        *,
        asynchronous: bool,
        multi_tier: bool,
        every_steps: int,
        single_tier: StorageTier = OBJECT_STORE,
    ):
        """``single_tier``: where a strategy that is not multi-tier saves (object_store, local)."""
        self.costs = costs
        self.gb = state_gb
        self.asynchronous = asynchronous
        self.multi_tier = multi_tier
        self.single_tier = single_tier
        self._single_write_gbps = (
            costs.local_write_gbps if single_tier == LOCAL else costs.object_write_gbps
        )
        self.launch_every_steps = max(1, every_steps)
        self.schedule = CheckpointSchedule(self.launch_every_steps)
        self._command_ts = 0
        self.captures: list[Capture] = []
        self._count = 0

    @property
    def every_steps(self) -> int:
        """The interval in force on the ranks."""
        return self.schedule.every_steps

    def relaunched(self) -> None:
        """New ranks (or ranks restarted in process): the schedule starts over."""
        self.schedule = CheckpointSchedule(self.launch_every_steps)

    def set_interval(self, every_steps: int) -> None:
        """A ``SetCheckpointInterval`` reached the ranks; it is put to the vote."""
        self._command_ts += 1
        self.schedule.receive_interval(self._command_ts, max(1, every_steps))

    def _seconds(self, gbps: float) -> float:
        return self.costs.latency_s + self.gb / gbps

    @property
    def stall_s(self) -> float:
        """Training time one save blocks."""
        if self.asynchronous:
            # walking the state and the copy into host memory; the manifest and barrier
            # happen in the background
            return self.costs.snapshot_latency_s + self.gb / self.costs.snapshot_gbps
        return self._seconds(self._single_write_gbps)

    def due(self, step: int, *, solo: bool) -> bool:
        """Whether the ranks checkpoint ``step`` (called once per step, as the shim does).

        Every simulated rank holds the same commands, so the ballot of one is the reduced one."""
        sched = self.schedule
        ballot = sched.vote() if sched.is_agreement_step(step, solo) else None
        return sched.decide(step, ballot) and step > 0

    def busy(self, now: int) -> bool:
        """An asynchronous save still persisting: the next one is dropped, not queued."""
        return bool(self.captures) and self.first_durable_ns(self.captures[-1]) > now

    def capture(self, step: int, resumed_ns: int) -> Capture:
        """A save whose snapshot ended at ``resumed_ns``; its tiers' durable times follow."""
        c = self.costs
        durable: dict[str, int] = {}
        if not self.asynchronous:
            durable[self.single_tier] = resumed_ns
        elif not self.multi_tier:
            durable[self.single_tier] = resumed_ns + int(
                self._seconds(self._single_write_gbps) * NS
            )
        else:
            local = resumed_ns + int(self._seconds(c.local_write_gbps) * NS)
            durable[LOCAL] = local
            durable[PEER] = local + int(self._seconds(c.peer_gbps) * NS)
            if self._count % c.object_every == 0:
                durable[OBJECT_STORE] = local + int(self._seconds(c.object_write_gbps) * NS)
        self._count += 1
        captured = Capture(step, resumed_ns, durable)
        self.captures = [*self.captures[-63:], captured]
        return captured

    @staticmethod
    def first_durable_ns(capture: Capture) -> int:
        return min(capture.durable_ns.values())

    def discard_after(self, step: int | None) -> None:
        """A numerical rollback: the copies newer than ``step`` hold the fault; none is
        restored again (the shim discards them, ``shim/rollback.py``). None: keep all."""
        if step is not None:
            self.captures = [c for c in self.captures if c.step <= step]

    def restore_from_host(self) -> tuple[Capture | None, RestoredFrom, float]:
        """An in-process restart: the newest snapshot, which every surviving rank holds in
        host memory (a replaced rank is sent it), read at the snapshot's bandwidth."""
        if not self.captures:
            return None, NOTHING_RESTORED, 0.0
        return self.captures[-1], HOST, self._seconds(self.costs.snapshot_gbps)

    def restore(
        self, fault_ns: int, *, fresh_node: bool, at_most_step: int | None = None
    ) -> tuple[Capture | None, RestoredFrom, float]:
        """The copy a relaunch restores: newest first, from the fastest tier that held it at
        ``fault_ns``; a node new to the job has no local copy. (None, "none", 0) restarts from
        scratch. ``at_most_step``: a replayed run restored this step (every rank must hold a
        copy, which one reference rank does not tell), so nothing newer is restored."""
        usable = [self.single_tier]
        if self.multi_tier:
            usable = [t for t in STORAGE_TIERS if TIERS[t].survives_node or not fresh_node]
        speed = {
            LOCAL: self.costs.local_read_gbps,
            PEER: self.costs.peer_read_gbps,
            OBJECT_STORE: self.costs.object_read_gbps,
        }
        for capture in reversed(self.captures):
            if at_most_step is not None and capture.step > at_most_step:
                continue
            held = [t for t in usable if capture.durable_ns.get(t, fault_ns + 1) <= fault_ns]
            if held:
                tier = max(held, key=lambda t: speed[t])
                return capture, tier, self._seconds(speed[tier])
        return None, NOTHING_RESTORED, 0.0
