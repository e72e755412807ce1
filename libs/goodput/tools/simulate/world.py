"""One simulated job: a discrete-event loop in which the real sensor and controller decide.

The decision path is goodput's own code, driven on a simulated clock (epoch ns):

* the sensor's :class:`goodput.supervisor.detect.Detector` gets the events the ranks and host monitors
  would send and its deadlines are served by :meth:`Detector.next_deadline` / ``poll``;
* the controller's :class:`goodput.supervisor.control.engine.Controller` (the built-in policy or a policy
  script, crash-loop rules, Young's checkpoint interval) turns its signals into commands, and
  folds results, statuses, steps and checkpoints with :mod:`goodput.supervisor.jobstate.folds`;
* the simulated actuator executes the commands with the real membership rules.

What is simulated is the world around them: the clock, the failures, the time each
checkpoint and remediation takes (the cost profile) and which events reach the sensor.

**Node granularity.** The sensor is per rank and a real job sends it thousands of heartbeats a
second; the simulator sends only the events that can change a decision. One rank per node
stands for the node (rank = position × GPUs per node). The *reference rank* (position 0)
stands for the job's progress: its steps, heartbeats and checkpoint events are sent as the
shim would send them. A node joins the sensor's view when something happens to it: its
rank's exit (crash), its last step before it hangs, its silence (a lost host), its host
monitor's reports (GPU XID, repair), its slow steps (straggler). Heartbeats of live ranks are
sent lazily, when a heartbeat deadline comes due, so the sensor never sees a live rank as
silent. A relaunch stops every rank it knows of and starts the reference rank again.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from goodput import schemas
from goodput.measure.accounting.calculator import compute_events_goodput
from goodput.measure.accounting.categories import PRODUCTIVE
from goodput.measure.accounting.report import GoodputReport
from goodput.schemas.tiers import LOCAL, NOTHING_RESTORED, RestoredFrom
from goodput.supervisor.control.engine import Controller, ControllerSettings
from goodput.supervisor.detect.detector import Detector
from goodput.supervisor.detect.thresholds import Thresholds
from goodput.supervisor.jobstate.folds import FAILURE_KINDS, new_job_state, observe_event
from goodput.supervisor.membership import Membership
from goodput.tools.simulate import messages as msg
from goodput.tools.simulate.actuator import Execution, SimActuator
from goodput.tools.simulate.checkpoints import CheckpointSystem
from goodput.tools.simulate.decisions import DecisionsMixin
from goodput.tools.simulate.faults import FaultsMixin
from goodput.tools.simulate.fleet import Fault, StepFault, node_names
from goodput.tools.simulate.profile import CostProfile, JobSpec, SimulateError
from goodput.tools.simulate.records import NS, T0, FedRank, MeasuredCosts, Pace, Slowing
from goodput.tools.simulate.saves import SAVE, SavesMixin
from goodput.tools.simulate.strategies import Strategy

JOB = msg.JOB
LOAD = "checkpoint-load"
POLICY_TIMEOUT_S = 120.0


@dataclass
class Result:
    strategy: str
    goodput_pct: float
    seconds: dict[str, float]
    badput: dict[str, float]
    interruptions: int
    rules: dict[str, int]
    sensor_events: int
    decisions: int
    steps: int
    wall_s: float
    final_interval_steps: int


class World(FaultsMixin, DecisionsMixin, SavesMixin):
    def __init__(
        self,
        job: JobSpec,
        profile: CostProfile,
        strategy: Strategy,
        trace: list[Fault],
        *,
        settings: ControllerSettings | None = None,
        thresholds: Thresholds | None = None,
        step_faults: list[StepFault] | None = None,
        until_step: int | None = None,
        measured: MeasuredCosts | None = None,
        shutdown_s: float = 0.0,
        follow_every_rank: bool = False,
        keep_global_batch: bool = False,
    ):
        """``step_faults`` fire at a training step (a replayed run's faults); ``until_step``
        ends the job when it reaches that step instead of at ``job.hours``, ``shutdown_s``
        after it (the ranks' exit); ``measured`` a replayed run's remediation costs;
        ``follow_every_rank``: the sensor gets every node's steps and heartbeats, as a real one
        does (a small job: a straggler is then judged on its whole history, not only from
        the moment it began); ``keep_global_batch``: an attempt on fewer nodes steps as
        much slower (the job keeps its global batch, as the demo's does by default), instead
        of at the job's step time."""
        self.job, self.profile, self.strategy, self.trace = job, profile, strategy, trace
        self._step_faults = sorted(step_faults or [], key=lambda f: f.at_step)
        self._repairs_at_step: list[tuple[int, str]] = []
        self._until_step = until_step
        self._shutdown_ns = int(shutdown_s * NS)
        self.measured = measured
        self._startup_s = profile.restart.startup_s
        #: this attempt's healthy step time: a replayed run's phases each ran at their own
        self._step_s = job.step_time_s
        #: a replayed attempt's steps and saves as its run measured them (none: at ``_step_s``)
        self._pace = Pace()
        #: a replay: the highest step done so far (it restores the run's step once reached)
        self._highest_step = 0
        self._follow_every_rank = follow_every_rank
        self._keep_global_batch = keep_global_batch
        names = node_names(job)
        spares = names[job.nodes :] if strategy.spares else []
        membership = Membership(
            active=names[: job.nodes], spares=spares, procs_per_node=job.gpus_per_node
        )
        self.now = T0
        self.end = T0 + int(job.hours * 3600 * NS)
        self.detector = Detector(JOB, thresholds)
        settings = msgspec.structs.replace(
            settings or ControllerSettings(),
            # a wall-clock limit would make results depend on the machine's load; a policy that
            # never returns still stops the simulation (one line naming the script)
            policy_timeout_s=POLICY_TIMEOUT_S,
            checkpoint_interval=msgspec.structs.replace(
                (settings or ControllerSettings()).checkpoint_interval,
                enabled=strategy.interval_tuning,
            ),
        )
        self.controller = Controller(strategy.policy, settings)
        if self.controller.script is not None and self.controller.script.load_error:
            raise SimulateError(self.controller.script.load_error)
        self.actuator = SimActuator(
            JOB,
            membership,
            profile.restart,
            measured,
            standbys_per_node=job.gpus_per_node if strategy.standbys else 0,
            start_ns=T0,
        )
        every = max(1, round(job.checkpoint_interval_s / job.step_time_s))
        if strategy.multi_tier:
            # the object store keeps the job's cadence; the cheap local tier saves k× as often
            every = max(1, every // profile.checkpoint.object_every)
        state = new_job_state(
            JOB,
            list(membership.active),
            num_nodes_per_dp=job.num_nodes_per_dp,
            spares=spares,
            procs_per_node=job.gpus_per_node,
            now=T0,
        )
        state = observe_event(state, self.actuator.status(T0), T0)
        self.state = msgspec.structs.replace(state, checkpoint_interval_steps=every)
        self.ckpt = CheckpointSystem(
            profile.checkpoint,
            job.state_gb_per_node,
            asynchronous=strategy.asynchronous,
            multi_tier=strategy.multi_tier,
            single_tier=strategy.single_tier,
            every_steps=every,
        )
        #: what the job is doing: startup, restore, running, saving, detect, decide, restart, down
        self.phase = "startup"
        #: the events ``goodput report`` reads of a real job (the reference rank's, the signals
        #: and decisions): the Result is the real calculator's account of them
        self.stream: list[schemas.Event] = []
        self._last_step_ns = T0
        #: the running attempt's world size (a scale-up changes the membership before its stop:
        #: the old attempt trains on at its own size meanwhile)
        self._world_gpus = job.nodes * job.gpus_per_node
        self._heap: list[tuple[int, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self._fed: dict[int, FedRank] = {}
        self._broken: dict[str, str] = {}
        #: straggling nodes: how much slower the job steps with each, and its compute factor
        self._straggling: dict[str, Slowing] = {}
        #: nodes whose replica a silent data corruption struck, and in which attempt
        self._corrupt: dict[str, int] = {}
        self._compute_factor: dict[str, float] = {}
        self._failure_ns: int | None = None
        self._gen = 0
        self._next_step: int | None = None
        self._last_active = set(membership.active)
        self._stopped = False
        self.step = 0
        self.rules: Counter[str] = Counter()
        self.sensor_events = 0
        self.decisions = 0
        self.interruptions = 0
        # a live rank's heartbeat is sent when a deadline finds it a polling period old: a
        # real sensor hears them continuously, and takes a quiet of two periods for a stall of
        # its own, deferring a hang verdict (at one beat per heartbeat timeout a demo's hang
        # went unseen for the whole job: two ranks' beats never fell within two periods)
        self._beat_ns = int(self.detector.thresholds.heartbeat_polling_period_s * NS)
        self._latency = int(profile.detection.event_latency_s * NS)
        self._sensor_dirty = True
        self._deadline: int | None = None
        self._slow_key: tuple[int, int] | tuple[()] = ()
        self._straggle_changes = 0
        self._slow = 1.0
        #: the active stragglers when one of them slows step by step (a replay's), else none
        self._stepwise: list[Slowing] = []
        self.actuator.broken = self._broken

    # ---- the loop -----------------------------------------------------------------------------

    def run(self) -> Result:
        started = time.perf_counter()
        for fault in self.trace:
            self._at(T0 + int(fault.at_s * NS), self._fault, fault)
        self._feed(schemas.RunStarted(job=JOB, ts=T0, run_id="sim", command_id="sim"))
        self._launch(None)
        if self.actuator.ready_at:
            self._at(min(self.actuator.ready_at.values()), self._standbys_ready)
        heap = self._heap
        end = self.end
        while not self._stopped:
            # the sensor's next deadline changes only when it is fed: recomputed only then
            if self._sensor_dirty:
                self._deadline = self.detector.next_deadline()
                self._sensor_dirty = False
            t = end
            kind = 0
            if heap and heap[0][0] < t:
                t, kind = heap[0][0], 1
            if self._deadline is not None and self._deadline <= t:
                t, kind = self._deadline, 2
            if self._next_step is not None and self._next_step <= t:
                t, kind = self._next_step, 3
            if kind == 0:
                break
            self.now = t
            if kind == 3:
                self._step()
            elif kind == 2:
                self._wake_sensor()
            else:
                _, _, action, args = heapq.heappop(heap)
                action(*args)
        self.now = self.end
        report = self._account()
        return Result(
            strategy=self.strategy.name,
            goodput_pct=report.goodput_pct,
            seconds={PRODUCTIVE: report.productive_s, **report.badput},
            badput=dict(report.badput),
            interruptions=self.interruptions,
            rules=dict(self.rules),
            sensor_events=self.sensor_events,
            decisions=self.decisions,
            steps=self.step,
            wall_s=time.perf_counter() - started,
            final_interval_steps=self.ckpt.every_steps,
        )

    def _account(self) -> GoodputReport:
        """The calculator's report on the job's events, closed by the reference rank's exit:
        at the horizon a running job's window ends with its last step (the horizon cuts it,
        it did not stop), a stopped or finished one's at its end."""
        running = self.phase in ("running", "saving") and not self._stopped
        close_ns = self._last_step_ns if running else self.end
        ref = self.actuator.membership.active[0]
        self.stream.append(msg.rank_exited(ref, 0, close_ns, self.actuator.attempt, exit_code=0))
        nominal = self.job.nodes * self.job.gpus_per_node
        return compute_events_goodput(self.stream, job=JOB, nominal_world_size=nominal)

    def _at(self, when: int, action: Callable[..., None], *args: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, action, args))

    # ---- the sensor -------------------------------------------------------------------------

    def _feed(self, event: schemas.Event) -> None:
        self.sensor_events += 1
        self._sensor_dirty = True
        for signal in self.detector.on_event(event, self.now):
            self._signalled(signal)

    def _tell(self, event: schemas.Event) -> None:
        """An event of the reference rank that the sensor hears at once and ``goodput report``
        reads too."""
        self.stream.append(event)
        self._feed(event)

    def _feed_step(self, event: schemas.StepDone) -> None:
        """The hottest path: straight to the detector's step handler (what ``on_event`` calls)."""
        self.sensor_events += 1
        self._sensor_dirty = True
        for signal in self.detector.on_step(event, self.now):
            self._signalled(signal)

    def _feed_later(self, delay_ns: int, event: schemas.Event) -> None:
        self._at(self.now + delay_ns, self._deliver, event)

    def _deliver(self, event: schemas.Event) -> None:
        self._feed(msgspec.structs.replace(event, ts=self.now))

    def _wake_sensor(self) -> None:
        """A deadline came due: live ranks' heartbeats first (lazily sent), then the poll."""
        for rank, fed in self._fed.items():
            if fed.heartbeating and self.now - fed.last_beat >= self._beat_ns:
                self._beat(rank, fed)
        self.sensor_events += 1
        self._sensor_dirty = True
        for signal in self.detector.poll(self.now):
            self._signalled(signal)

    def _beat(self, rank: int, fed: FedRank) -> None:
        fed.last_beat = self.now
        self._feed(msg.heartbeat(fed.node, rank, self.now, fed.busy))

    def _signalled(self, signal: schemas.Signal) -> None:
        if self.phase == "detect" and signal.signal in FAILURE_KINDS:
            self.phase = "decide"
        self.stream.append(signal)
        self._at(self.now + int(self.profile.detection.decision_s * NS), self._decide, signal)

    # ---- training -----------------------------------------------------------------------------

    def _launch(self, execution: Execution | None) -> None:
        """Ranks started on the current membership: restore, start up, then train."""
        active = self.actuator.membership.active
        fresh = any(n not in self._last_active for n in active)
        self._last_active = set(active)
        self._gen += 1
        gen = self._gen
        cost = execution.cost if execution is not None else None
        if execution is not None:
            self.ckpt.discard_after(execution.rollback_bound)  # a numerical rollback's
            capture, tier, restore_s = (
                self.ckpt.restore_from_host()
                if execution.in_process and cost is None
                else self.ckpt.restore(
                    self._failure_ns or self.now,
                    fresh_node=fresh,
                    at_most_step=min(
                        (
                            bound
                            for bound in (
                                cost.restored_step if cost is not None else None,
                                execution.rollback_bound,
                            )
                            if bound is not None
                        ),
                        default=None,
                    ),
                )
            )
            self.step = capture.step if capture else 0
            restored = capture is not None
            restored_step = cost.restored_step if cost is not None else None
            if (
                cost is not None
                and restored_step is not None
                and restored_step <= self._highest_step
            ):
                # what the run lost is measured: the step every rank restored
                self.step = restored_step
                restore_s, restored = cost.restore_s, True
                tier = tier if capture is not None else LOCAL
        else:
            capture, tier, restore_s, restored = None, NOTHING_RESTORED, 0.0, False
        self._pace = Pace()
        if cost is not None:
            self._startup_s = cost.startup_s
            self._step_s = cost.step_time_s or self.job.step_time_s
            self._pace = cost.pace
        elif execution is None and self.measured is not None:
            self._startup_s = self.measured.first_startup_s
            self._step_s = self.measured.first_step_time_s or self.job.step_time_s
            self._pace = self.measured.first_pace
        elif execution is not None and execution.warm:
            self._startup_s = self.profile.restart.warm_startup_s
        else:
            self._startup_s = self.profile.restart.startup_s
        if cost is None and self._keep_global_batch:
            self._step_s = self.job.step_time_s * self.job.nodes / len(active)
        self._failure_ns = None
        self.phase = "restore" if restore_s else "startup"
        ref = FedRank(active[0], busy=LOAD if restore_s else "", last_beat=self.now)
        self._fed = {0: ref}
        world = self._world_gpus = len(active) * self.job.gpus_per_node
        self._tell(msg.rank_started(active[0], 0, self.now, world, self.actuator.attempt))
        self._beat(0, ref)
        if self._follow_every_rank:
            for position, node in enumerate(active[1:], 1):
                self._register(position * self.job.gpus_per_node, FedRank(node))
        for position, node in enumerate(active):
            if node in self._straggling:
                self._watch_straggler(position, node)
        broken = [(p, n) for p, n in enumerate(active) if n in self._broken]
        if broken:
            self._fail()
            for position, node in broken:
                self._manifest(position, node, self._broken[node])
            return
        self._at(
            self.now + int(restore_s * NS),
            self._restored,
            gen,
            tier,
            restore_s,
            restored,
        )

    def _restored(self, gen: int, tier: RestoredFrom, restore_s: float, restored: bool) -> None:
        if gen != self._gen:
            return
        ref = self._fed.get(0)
        if restored and ref is not None:
            ref.busy = ""
            self._tell(msg.checkpoint_restored(ref.node, self.now, self.step, tier, restore_s))
        self.phase = "startup"
        startup = int(self._startup_s * NS)
        self._at(self.now + startup, self._resume, gen)

    def _resume(self, gen: int) -> None:
        if gen != self._gen:
            return
        self.phase = "running"
        if self.step == 0:
            self._book_unpaced_save(after=False)
        self._next_step = self.now + self._step_ns()

    def _step_ns(self) -> int:
        """How long the next step takes."""
        return int(self._step_time(self.step + 1) * NS)

    def _step(self) -> None:
        self.step += 1
        step_time = self._step_time(self.step)
        world = len(self._fed)
        reported: schemas.StepDone | None = None
        for rank, fed in self._fed.items():
            if fed.stepping:
                compute = self._step_s * fed.compute_factor
                done = msg.step_done(fed.node, rank, self.now, self.step, step_time, compute, world)
                self._feed_step(done)
                reported = done if rank == 0 else reported
        if self.measured is not None:  # only a replay restores a step it names
            self._highest_step = max(self._highest_step, self.step)
        if reported is not None:  # the reference rank's step, with its attempt's world size
            self.stream.append(msgspec.structs.replace(reported, world_size=self._world_gpus))
            self._last_step_ns = self.now
        if self._until_step is not None and self.step >= self._until_step:
            self._finish()
            return
        if reported is not None:  # the controller hears rank 0's steps, as the service does
            self.state = observe_event(self.state, reported, self.now)
        solo = len(self.actuator.membership.active) * self.job.gpus_per_node == 1
        due = self.ckpt.due(self.step, solo=solo)
        if due and not self.ckpt.busy(self.now):
            self.phase = "saving"
            self._next_step = None
            # every rank saves (a rank followed beside the reference one, seen stepping no more
            # for a long synchronous save, was taken for hung)
            for rank, fed in self._fed.items():
                if fed.stepping:
                    fed.busy = SAVE
                    self._beat(rank, fed)
            stall, waited = self._pace.save_s(self.step, self.ckpt.stall_s)
            self._at(self.now + int(waited * NS), self._saved, self._gen, stall, waited)
        else:
            self._next_step = self.now + self._step_ns()
        if self._step_faults or self._repairs_at_step:
            self._step_events()
        if self.step % self.job.fingerprint_every_steps == 0:
            self._fingerprints()

    def _finish(self) -> None:
        """The job did its steps; its ranks exit (a replayed run's measured shutdown)."""
        self._next_step = None
        self.phase = "down"
        self.end, self._stopped = self.now + self._shutdown_ns, True
        self._book_unpaced_save(after=True)
