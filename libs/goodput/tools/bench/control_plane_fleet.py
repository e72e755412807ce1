"""The simulated fleet of `goodput bench control-plane`: ranks that publish what the shim's link
publishes, at the link's rates, from a few publisher processes.

Each rank heartbeats on core NATS every ``heartbeat_s`` (the link's ``heartbeat_period_s``);
every ``step_s`` each node publishes its ranks' steps rolled up into JetStream (one
``StepsDone``, made by the shim's own ``step_rollup.rolled_up``, as the node's first rank's
link does) and, every ``ckpt_every`` steps, each rank a ``CheckpointSaved`` and (a step
later) a ``CheckpointPersisted``: the link's subjects, the project's codec and the
``Nats-Msg-Id`` header the link's ``emit`` sets. Each node's host
monitor reports its ``HostHealth`` (a GPU record per rank) every ``host_report_s``. A silenced
node is a lost one: its ranks' heartbeats and events and its host's reports all stop. The link awaits each
ack from its own connection; a publisher process stands for thousands of ranks, so it
pipelines (``publish_async``) and counts the acks. The ranks of a synchronous job finish a step
together: a step's events leave within its first :data:`STEP_SPREAD_S`, spread evenly over
the nodes.

A rank's heartbeats leave from the link's own thread, not behind its events; so the heartbeats
of a share of the nodes and their stored events (host reports, steps, checkpoints) leave from
two processes (:data:`ROLES`), and a burst of events does not hold the heartbeats back.
Heartbeats go out as the link's ``publish_core`` puts them on the wire (no headers outside a
trace), from subjects and structs made once.

Every publisher schedules by the wall clock in ticks of :data:`TICK_S` from a start shared by
all of them; when it falls behind it catches up, so what it could not keep shows as lag (how
late a tick left after its time) and as acks short of the events due. Both are reported:
a bench whose publishers publish less than they claim would be a fake result.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import queue
import time
from dataclasses import dataclass

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.shim.step_rollup import rolled_up

#: as long as the store sizing's widest job name (``Widths.job_name_chars``): stored bytes alike
JOB = "cp-bench-70b-job"
TICK_S = 0.01
#: ticks a publisher behind its schedule runs before it reads its commands again
CATCH_UP_TICKS = 10
#: a step's events leave within this long after the step ends (the ranks are not in lockstep)
STEP_SPREAD_S = 0.5
#: what one publisher process of a share of the nodes publishes
ROLES = ("heartbeats", "events")
#: the counters each publisher keeps in its shared array, by index
COUNTERS = (
    "heartbeats",
    "events_due",
    "events_acked",
    "events_failed",
    "steps_acked",
    "host_reports_acked",
    "ckpt_events_acked",
    "lag_max_s",
)
HEARTBEATS, DUE, ACKED, FAILED, STEPS_ACKED, HOSTS_ACKED, CKPT_ACKED, LAG_MAX = range(len(COUNTERS))


@dataclass(frozen=True)
class FleetShape:
    nodes: int
    procs_per_node: int
    heartbeat_s: float
    step_s: float
    ckpt_every: int
    host_report_s: float

    @property
    def ranks(self) -> int:
        return self.nodes * self.procs_per_node


def node_name(n: int) -> str:
    return f"sim-{n}"


def node_ranks(shape: FleetShape, n: int) -> range:
    return range(n * shape.procs_per_node, (n + 1) * shape.procs_per_node)


class _Publisher:
    """The ranks of nodes ``[first, last)``, published from one connection."""

    def __init__(
        self, bus: Bus, shape: FleetShape, first: int, last: int, role: str, counters
    ) -> None:
        self.bus, self.shape, self.role, self.counters = bus, shape, role, counters
        self.nodes = list(range(first, last))
        self.ranks = [r for n in self.nodes for r in node_ranks(shape, n)]
        self.beats = {
            r: schemas.Heartbeat(
                job=JOB, node=node_name(r // shape.procs_per_node), rank=r, pid=100_000 + r, step=0
            )
            for r in self.ranks
        }
        self.subjects = {r: subjects.heartbeat(JOB, beat.node, r) for r, beat in self.beats.items()}
        self.silent: set[int] = set()  # ranks
        self.lost: set[int] = set()  # nodes
        self.report_ticks = max(round(shape.host_report_s / TICK_S), 1)
        self.beat_ticks = max(round(shape.heartbeat_s / TICK_S), 1)
        self.step_ticks = max(round(shape.step_s / TICK_S), 1)
        self.spread_ticks = max(min(round(STEP_SPREAD_S / TICK_S), self.step_ticks), 1)
        self.lags: list[float] = []

    async def tick(self, k: int) -> None:
        """What the role has due at tick ``k``: a slice of the heartbeats, or of the host
        reports and of the step's events."""
        step = k // self.step_ticks
        if self.role == "heartbeats":
            for r in self.ranks[k % self.beat_ticks :: self.beat_ticks]:
                if r not in self.silent:
                    beat = self.beats[r]
                    beat.step = step
                    await self.bus.nc.publish(self.subjects[r], schemas.encode(beat))
                    self.counters[HEARTBEATS] += 1
            return
        for n in self.nodes[k % self.report_ticks :: self.report_ticks]:
            if n not in self.lost:
                await self._store(self._host_report(n))
        offset = k % self.step_ticks
        if step == 0 or offset >= self.spread_ticks:
            return
        for n in self.nodes[offset :: self.spread_ticks]:
            for event in self._events(n, step):
                await self._store(event)

    def _host_report(self, n: int) -> schemas.HostHealth:
        ranks = self.shape.procs_per_node
        return schemas.HostHealth(
            job=JOB,
            node=node_name(n),
            healthy=True,
            gpu_available=True,
            gpus=[
                schemas.GpuHealth(index=i, uuid=f"GPU-{n:08x}-{i:04x}", temperature_c=65.0)
                for i in range(ranks)
            ],
            disk_free_bytes=1 << 40,
            disk_total_bytes=2 << 40,
            mem_available_bytes=1 << 40,
            mem_total_bytes=2 << 40,
            ranks_alive=ranks,
            ranks_expected=ranks,
            attempt=1,
        )

    def _events(self, n: int, step: int) -> list[schemas.Event]:
        """What node ``n``'s ranks report as step ``step`` ends: their steps rolled up, then
        each rank's checkpoint events (the links' order)."""
        shape, ranks = self.shape, [r for r in node_ranks(self.shape, n) if r not in self.silent]
        reports = [
            schemas.StepDone(
                job=JOB,
                node=node_name(n),
                rank=rank,
                step=step,
                step_time_s=shape.step_s,
                tokens=4096 * 8,
                loss=2.0,
                world_size=shape.ranks,
                compute_time_s=shape.step_s * 0.9,
            )
            for rank in ranks
        ]
        first = node_ranks(shape, n)[0]
        events: list[schemas.Event] = [*rolled_up(JOB, node_name(n), first, reports)]
        for rank in ranks:
            events += self._checkpoint_events(rank, step)
        return events

    def _checkpoint_events(self, rank: int, step: int) -> list[schemas.Event]:
        node, shape = self.beats[rank].node, self.shape
        events: list[schemas.Event] = []
        if step % shape.ckpt_every == 0:
            events.append(
                schemas.CheckpointSaved(
                    job=JOB, node=node, rank=rank, step=step, stall_s=0.2, bytes=4 << 30
                )
            )
        if step > 1 and (step - 1) % shape.ckpt_every == 0:
            events.append(
                schemas.CheckpointPersisted(
                    job=JOB,
                    node=node,
                    rank=rank,
                    step=step - 1,
                    path=f"/ckpt/{JOB}/step-{step - 1:010d}/rank-{rank:05d}",
                    bytes=4 << 30,
                    duration_s=shape.step_s,
                )
            )
        return events

    async def _store(self, event: schemas.Event) -> None:
        """As the link's ``emit``: the event's subject, its encoding, a fresh message id."""
        payload = schemas.encode(event)
        self.counters[DUE] += 1
        ack = await self.bus.js.publish_async(
            subjects.event_for(event),
            payload,
            wait_stall=5.0,
            headers={"Nats-Msg-Id": schemas.new_id()},
        )
        ack.add_done_callback(self._counter(event))

    def _counter(self, event: schemas.Event):
        kind = {schemas.StepsDone: STEPS_ACKED, schemas.HostHealth: HOSTS_ACKED}.get(
            type(event), CKPT_ACKED
        )

        def count(future: asyncio.Future) -> None:
            if future.cancelled() or future.exception() is not None:
                self.counters[FAILED] += 1
            else:
                self.counters[ACKED] += 1
                self.counters[kind] += 1

        return count


def publish(
    url: str,
    shape: FleetShape,
    first: int,
    last: int,
    role: str,
    start_at: float,
    commands: multiprocessing.Queue,
    counters,
    stopped_at,
    results: multiprocessing.Queue,
) -> None:
    """Publisher process of ``role`` for nodes ``[first, last)``, ticking from wall time
    ``start_at``.

    Commands: ``("silence", node)`` (the node is lost; the heartbeats' process puts the time in
    ``stopped_at``), ``("resume", node)``, ``("mark", 0)`` (lags are kept from here),
    ``("quit", 0)`` (``(role, lags kept)`` go to ``results``)."""

    async def main() -> None:
        bus = await Bus.connect(BusSettings(url=url), name=f"goodput-bench-{role}-{first}")
        publisher = _Publisher(bus, shape, first, last, role, counters)
        marked = False
        k = 0
        while True:
            while True:
                try:
                    action, node = commands.get_nowait()
                except queue.Empty:
                    break
                if action == "quit":
                    await bus.nc.flush()
                    await bus.close()
                    results.put((role, publisher.lags if marked else []))
                    return
                if action == "mark":
                    marked = True
                elif action == "silence":
                    publisher.silent.update(node_ranks(shape, node))
                    publisher.lost.add(node)
                    if role == "heartbeats":
                        stopped_at.value = time.time_ns()
                elif action == "resume":
                    publisher.silent.difference_update(node_ranks(shape, node))
                    publisher.lost.discard(node)
            # a publisher behind its schedule catches up a few ticks at a time, reading its
            # commands between: a silence or a quit must not wait for it to catch up
            due = min(int((time.time() - start_at) / TICK_S), k + CATCH_UP_TICKS)
            while k <= due:
                lag = time.time() - (start_at + k * TICK_S)
                await publisher.tick(k)
                if marked:
                    publisher.lags.append(lag)
                    counters[LAG_MAX] = max(counters[LAG_MAX], lag)
                k += 1
            await asyncio.sleep(max(start_at + k * TICK_S - time.time(), 0))

    asyncio.run(main())


def shares(nodes: int, processes: int) -> list[tuple[int, int]]:
    """Nodes ``[first, last)`` of each publisher process, as even as they divide."""
    processes = min(processes, nodes)
    bounds = [nodes * i // processes for i in range(processes + 1)]
    return list(itertools.pairwise(bounds))
