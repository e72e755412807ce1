"""The controller service process: signals in, decisions and commands out, one leader at a time.

Every instance competes for the lease; the leader consumes the job's events, keeps the
``JobState`` and runs the policy. Crash safety comes from an outbox: a decision and its
commands are written into the stored record *with* the new state (one compare-and-set), then
published, then cleared. A standby that takes over republishes whatever the outbox still
holds; decision and command ids are deterministic and used as message ids, so the bus and the
actuator drop what already went out.

Tracing: deciding about a signal is a span under the sensor's signal span (its context comes in
the message headers). The record keeps the ``traceparent`` of each stored decision, command and
deferred signal, so what a standby resends — or a back-off releases later — still belongs to
the remediation's trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
import nats.js.errors
import xxhash
from nats.aio.msg import Msg
from opentelemetry.context import Context

from goodput import schemas, subjects
from goodput.bus import DurableConsumer
from goodput.config import ServiceConfig
from goodput.supervisor.control.engine import Controller, Outcome
from goodput.supervisor.jobstate.folds import controller_filters, new_job_state, observe_event
from goodput.supervisor.jobstate.model import AnyCommand, JobState
from goodput.telemetry import attached, context_from_traceparent, current_traceparent, tracer
from goodput_services.base import Service
from goodput_services.controller.lease import Lease
from goodput_services.controller.options import ControllerOptions
from goodput_services.controller.policy_process import PolicyProcess

log = logging.getLogger(__name__)


class ControllerRecord(msgspec.Struct, kw_only=True):
    """What survives the leader: the job state and the commands not yet known to be sent."""

    state: JobState | None = None
    outbox: list[AnyCommand] = msgspec.field(default_factory=list)
    #: decisions not yet published (published with their id as message id: never twice)
    decisions: list[schemas.Decision] = msgspec.field(default_factory=list)
    #: W3C traceparent of the remediation each stored decision, command and deferred signal
    #: belongs to, by its id (only ids still stored are kept)
    traces: dict[str, str] = msgspec.field(default_factory=dict)


class ControllerService(Service):
    name = "controller"
    options_type = ControllerOptions
    options: ControllerOptions

    def __init__(self, config: ServiceConfig):
        super().__init__(config)
        settings = self.options.settings
        #: the user's script, in a worker process: it cannot take the controller down
        self.policy: PolicyProcess | None = None
        if self.options.policy:
            self.policy = PolicyProcess(
                self.options.policy,
                timeout_s=settings.policy_timeout_s,
                load_timeout_s=settings.policy_load_timeout_s,
            )
            if self.policy.load_error:
                raise SystemExit(self.policy.load_error)  # not "healthy" until a fault
        self.controller = Controller(settings=settings, script=self.policy)
        self.lease_ttl_s = self.options.lease_ttl_s
        self.pause_before_send_s = self.options.inject_pause_before_send_s
        self.record = ControllerRecord()
        self.revision: int | None = None
        self.leading = False
        self.decisions = 0
        self._dirty = False
        self._leader_tasks: list[asyncio.Task[None]] = []
        self._consumer: DurableConsumer | None = None
        #: held from reading the state to storing what a decision made of it: the policy runs
        #: off the event loop (the lease and health go on), and events and timers take turns
        self._deciding = asyncio.Lock()
        self._tracer = tracer("goodput.controller")

    @property
    def state_key(self) -> str:
        return subjects.kv_key(self.job, "controller")

    def loops(self):
        return [self._leadership()]

    def health(self) -> tuple[bool, str]:
        role = "leader" if self.leading else "standby"
        restarts = f" (worker restarted {self.policy.restarts}x)" if self.policy else ""
        policy = f"policy {self.controller.policy_name}{restarts}"
        return True, f"{role}, {policy}, {self.decisions} decision(s)"

    async def on_stop(self) -> None:
        if self.policy is not None:
            await asyncio.to_thread(self.policy.close)

    # ---- leadership --------------------------------------------------------------------------

    async def _leadership(self) -> None:
        assert self.bus is not None
        lease = Lease(self.bus, self.job, "controller", self.instance, self.lease_ttl_s)
        try:
            while not self.stopping.is_set():
                try:
                    holding = await lease.acquire_or_renew(time.time_ns())
                except Exception as exc:  # the bus is down: nobody can lead through it anyway
                    log.debug("lease check failed: %r", exc)
                    holding = False
                if holding and not self.leading:
                    await self._lead()
                elif not holding and self.leading:
                    await self._step_down()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.lease_ttl_s / 3)
        finally:
            if self.leading:
                await self._step_down()
                with contextlib.suppress(Exception):
                    await lease.release()

    async def _lead(self) -> None:
        log.info("leading", extra={"instance": self.instance})
        self.leading = True
        await self._load()
        await self._flush_outbox()
        assert self.bus is not None
        self._consumer = DurableConsumer(
            self.bus,
            stream=subjects.EVENTS_STREAM,
            durable=f"{self.job}-controller",
            # only what it folds or decides on: not the other ranks' steps and checkpoints
            subject=controller_filters(self.job),
            decode=schemas.decode_event,
            handler=self._on_event,
            service=self.name,
            job=self.job,
            batch=256,
            ack_wait_s=3.0,  # a standby gets what a dead leader held within seconds
        )
        self._leader_tasks = [
            asyncio.create_task(self._consumer.run()),
            asyncio.create_task(self._timers()),
        ]

    async def _step_down(self) -> None:
        log.warning("no longer leading", extra={"instance": self.instance})
        self.leading = False
        if self._consumer is not None:
            self._consumer.stop()
        for task in self._leader_tasks:
            task.cancel()
        await asyncio.gather(*self._leader_tasks, return_exceptions=True)
        self._leader_tasks = []

    # ---- the stored record -------------------------------------------------------------------

    async def _load(self) -> None:
        assert self.bus is not None
        kv = await self.bus.kv(subjects.STATE_BUCKET)
        try:
            entry = await kv.get(self.state_key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            self.record, self.revision = ControllerRecord(), None
            return
        try:
            self.record = msgspec.msgpack.decode(entry.value or b"", type=ControllerRecord)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("stored controller state is unreadable (%s); starting afresh", exc)
            self.record = ControllerRecord()
        self.revision = entry.revision

    async def _store(self) -> None:
        """Compare-and-set the record; losing the race means another leader: step down."""
        assert self.bus is not None
        kv = await self.bus.kv(subjects.STATE_BUCKET)
        payload = msgspec.msgpack.encode(self.record)
        try:
            if self.revision is None:
                self.revision = await kv.create(self.state_key, payload)
            else:
                self.revision = await kv.update(self.state_key, payload, last=self.revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            self.leading = False
            raise RuntimeError("controller state changed under us: another leader") from exc
        self._dirty = False

    async def _flush_outbox(self) -> None:
        """Publish stored decisions and send stored commands, then clear them."""
        assert self.bus is not None
        if not (self.record.outbox or self.record.decisions):
            return
        for decision in self.record.decisions:
            log.info(
                "decision",
                extra={"rule": decision.rule, "reason": decision.reason, "error": decision.error},
            )
            with attached(self._stored_context(decision.decision_id)):
                await self.bus.publish(
                    subjects.event_for(decision), decision, msg_id=decision.decision_id
                )
            self.decisions += 1
        for command in self.record.outbox:
            target = subjects.command_target(command)
            kind = schemas.kind_of(type(command))
            with (
                attached(self._stored_context(command.command_id)),
                self._tracer.start_as_current_span(
                    f"controller send {kind}",
                    attributes={"goodput.command_id": command.command_id, "goodput.target": target},
                ),
            ):
                await self.bus.send_command(target, command)
        sent = msgspec.structs.replace(self.record, outbox=[], decisions=[])
        self.record = msgspec.structs.replace(sent, traces=self._live_traces(sent))
        await self._store()

    def _stored_context(self, item_id: str) -> Context | None:
        """The trace a stored decision or command belongs to (None: the current one)."""
        traceparent = self.record.traces.get(item_id)
        return context_from_traceparent(traceparent) if traceparent else None

    @staticmethod
    def _live_traces(record: ControllerRecord) -> dict[str, str]:
        """The trace contexts of what the record still holds; the rest are forgotten."""
        live = {d.decision_id for d in record.decisions} | {c.command_id for c in record.outbox}
        if record.state is not None:
            live |= {d.signal.signal_id for d in record.state.deferred}
        return {key: value for key, value in record.traces.items() if key in live}

    # ---- inputs ------------------------------------------------------------------------------

    async def _on_event(self, event: schemas.Event, msg: Msg) -> None:
        async with self._deciding:
            for each in schemas.expand_steps(event):  # a node's rollup: its ranks' steps
                await self._handle_event(each)

    async def _handle_event(self, event: schemas.Event) -> None:
        if not self.leading:
            raise RuntimeError("not leading any more; leave the event to the leader")
        now = time.time_ns()
        state = self.record.state
        match event:
            # a (re)submitted job: its first launch is newer than the state we hold
            case schemas.JobStatus(state="running", attempt=1) if (
                state is None or event.ts > state.started_ts
            ):
                await self._start(event, now)
            case schemas.JobStatus() if state is not None:
                # membership is what the actuator reports, never what the controller predicted
                self._set_state(observe_event(state, event, now))
                await self._store()
            case schemas.ActionResult() if state is not None:
                outcome = await asyncio.to_thread(self.controller.settle, state, event, now)
                if outcome.state is not state:
                    self._log_settled(event)
                await self._apply(outcome)
                if outcome.decision is None and outcome.state is not state:
                    await self._store()
            case schemas.Signal() if state is not None:
                await self._decide(state, event, now)
            case schemas.StepDone(rank=0) if state is not None:
                self._set_state(observe_event(state, event, now))
            case schemas.CheckpointSaved(rank=0) | schemas.CheckpointPersisted(rank=0) if (
                state is not None
            ):
                observed = observe_event(state, event, now)
                self._set_state(observed)
                if isinstance(event, schemas.CheckpointPersisted):
                    await self._apply(self.controller.recommend_checkpoint_interval(observed, now))

    async def _start(self, status: schemas.JobStatus, now: int) -> None:
        """A job's first launch: its state, or a recorded refusal when no state can hold it."""
        nodes_per_dp = self.options.num_nodes_per_dp
        try:
            state = new_job_state(
                self.job,
                list(status.active_nodes),
                num_nodes_per_dp=nodes_per_dp,
                spares=list(status.spare_nodes),
                procs_per_node=status.procs_per_node,
                now=now,
            )
        except ValueError as exc:
            # a decision saying why, once, instead of a handler failing until dead-lettered
            reason = f"cannot supervise attempt 1 on {status.active_nodes or 'no nodes'}: {exc}"
            log.error(reason)
            decision = schemas.Decision(
                job=self.job,
                decision_id=xxhash.xxh3_128_hexdigest(f"{self.job}|refused|{status.ts}".encode()),
                signal_id="",
                policy=self.controller.policy_name,
                rule="job-refused",
                reason=reason,
                error=reason,
            )
            decisions = [*self.record.decisions, decision]
            self.record = msgspec.structs.replace(self.record, decisions=decisions)
            await self._store()
            await self._flush_outbox()
            return
        self._set_state(observe_event(state, status, now))
        await self._store()

    @staticmethod
    def _log_settled(result: schemas.ActionResult) -> None:
        if result.ok:
            log.info(
                "action done", extra={"command_id": result.command_id, "detail": result.detail}
            )
        else:
            log.warning(
                "action refused by the actuator: %s",
                result.detail,
                extra={"command_id": result.command_id, "action": result.action},
            )

    def _set_state(self, state: JobState) -> None:
        if state is not self.record.state:
            self.record = msgspec.structs.replace(self.record, state=state)
            self._dirty = True

    async def _decide(self, state: JobState, signal: schemas.Signal, now: int) -> None:
        """Run the policy on ``signal``: a child span of the sensor's (from the headers)."""
        with self._tracer.start_as_current_span(
            f"controller decide {signal.signal}",
            attributes={"goodput.signal_id": signal.signal_id, "goodput.node": signal.node},
        ) as span:
            outcome = await asyncio.to_thread(self.controller.handle, state, signal, now)
            if outcome.decision is not None:
                span.set_attribute("goodput.rule", outcome.decision.rule)
                span.set_attribute("goodput.commands", len(outcome.commands))
            await self._apply(outcome)

    def _traces_for(self, outcome: Outcome) -> dict[str, str]:
        """Remember which trace the outcome's decision, commands and deferrals belong to."""
        assert outcome.decision is not None
        traces = dict(self.record.traces)
        traceparent = current_traceparent()
        if traceparent:
            traces[outcome.decision.decision_id] = traceparent
            traces.update({c.command_id: traceparent for c in outcome.commands})
            signal_id = outcome.decision.signal_id
            if any(d.signal.signal_id == signal_id for d in outcome.state.deferred):
                traces.setdefault(signal_id, traceparent)
        return traces

    async def _apply(self, outcome: Outcome) -> None:
        if outcome.decision is None:
            self._set_state(outcome.state)
            return
        record = ControllerRecord(
            state=outcome.state,
            outbox=[*self.record.outbox, *outcome.commands],
            decisions=[*self.record.decisions, outcome.decision],
            traces=self._traces_for(outcome),
        )
        self.record = msgspec.structs.replace(record, traces=self._live_traces(record))
        await self._store()
        if self.pause_before_send_s:
            log.warning("fault injection: pausing %.1f s before sending", self.pause_before_send_s)
            await asyncio.sleep(self.pause_before_send_s)
        await self._flush_outbox()

    async def _decide_due(self, state: JobState) -> None:
        """Decide the signals whose back-off is over, each in its own remediation's trace."""
        outcomes = await asyncio.to_thread(self.controller.due, state, time.time_ns())
        contexts = {
            o.decision.signal_id: self._stored_context(o.decision.signal_id)
            for o in outcomes
            if o.decision is not None
        }
        for outcome in outcomes:
            signal_id = outcome.decision.signal_id if outcome.decision else ""
            with (
                attached(contexts.get(signal_id)),
                self._tracer.start_as_current_span(
                    "controller decide after back-off", attributes={"goodput.signal_id": signal_id}
                ),
            ):
                await self._apply(outcome)

    async def _timers(self) -> None:
        """Deferred (backed-off) signals when they come due; soft state saved now and then."""
        last_save = time.monotonic()
        while self.leading and not self.stopping.is_set():
            async with self._deciding:
                state = self.record.state
                if state is not None:
                    await self._decide_due(state)
                if self._dirty and time.monotonic() - last_save > 5.0:
                    await self._store()
                    last_save = time.monotonic()
            await asyncio.sleep(0.5)


SERVICE = ControllerService
