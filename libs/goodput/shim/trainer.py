"""The trainer shim: what a training script imports to be supervised by goodput.

    shim = TrainerShim.from_env()          # reads what the actuator put in the environment
    shim.on_rescale(keep_global_batch)     # what to change when the data-parallel size did
    restored = shim.restore(state, plan=BatchPlan(global_batch=..., lr=...))
    step = restored.step if restored else 0   # a RestoreResult: step, state, layout, plan, tier
    for step in ...:
        ...train...
        shim.step_done(step, step_time_s, tokens, loss)
        if shim.should_checkpoint(step): shim.save(state, step)   # returns after the snapshot
        if shim.should_stop(): break                               # SIGTERM / stop command
    shim.finish(state, step)               # final save, flush, exit code via shim.exit_code

``shim.guard(optimizer)`` makes saves overlap the next forward/backward (see ``guard``);
``restore`` prepares the save's host buffer, so the first save does not fault it in.

It implements the example job's ``TrainingHooks`` protocol, so any loop written against that
protocol is supervised by swapping in this object.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from goodput import schemas
from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine import events as ckpt_events
from goodput.checkpoint.engine.host_restore import HostRestore, restore_from_host
from goodput.checkpoint.engine.torch_save import TorchSaveCheckpointer
from goodput.launch.rank_env import EXIT_TERMINATED, skipped
from goodput.schemas.tiers import HOST, LOCAL, SHARED, RestoreSource
from goodput.shim.agree import all_reduce_min, grouped
from goodput.shim.ckpt_reports import checkpoint_report, restored_report
from goodput.shim.config import ShimConfig, node_parts
from goodput.shim.dp_layout import DpLayout
from goodput.shim.injected_faults import RANK_FAULT_KINDS, InjectedFaults
from goodput.shim.inprocess import RejoinMailbox, RunOutcome, run_in_process
from goodput.shim.link import BusLink
from goodput.shim.numerics import NumericsMonitor
from goodput.shim.rescale import BatchPlan, RescaleCallback, plan_event
from goodput.shim.restore_agreement import restore_agreed
from goodput.shim.restore_result import (
    CheckpointMetadata,
    RestoreResult,
    resolve_restore,
    with_metadata,
)
from goodput.shim.rollback import bounded, discard_after, mark_clean
from goodput.shim.schedule import CheckpointSchedule
from goodput.shim.step_protocol import RestartRequested
from goodput.shim.tracing import ShimTelemetry

log = logging.getLogger(__name__)


class TrainerShim:
    """Heartbeats, step and checkpoint events, commands, signals and async checkpoints."""

    def __init__(self, config: ShimConfig, *, install_signal_handlers: bool = True):
        self.config = config
        self.schedule = CheckpointSchedule(config.ckpt_every)
        self._schedule_lock = threading.Lock()  # commands arrive on the bus link's thread
        self.exit_code = 0
        self._stop_reason = ""
        self._faults = InjectedFaults(config)
        # the writer of the volume's checkpoints records in it the steps known clean
        writer_rank = config.local_rank if config.ckpt_mode != "torch-save" else config.rank
        #: the loop's loss, gradient norm and parameters: ``shim.numerics.observe`` each step
        self.numerics = NumericsMonitor(
            read_every=config.numerics_every,
            fingerprint_every=config.fingerprint_every,
            mp_size=config.model_parallel_size,
            publish=self._publish,
            job=config.job,
            node=config.node,
            inject=self._faults.at_step_boundary,
            on_clean=partial(mark_clean, config.ckpt_dir) if writer_rank == 0 else None,
        )
        #: set while the loop is the shim's own (``run``): Rejoin commands restart in process
        self._rejoins: RejoinMailbox | None = None
        #: the next restore may come from the engine's host buffers (this process kept them)
        self._memory_intact = False
        self._last_saved_step: int | None = None
        self._rescale_callbacks: list[RescaleCallback] = []
        #: the batch plan in force, saved with every checkpoint (``restore(plan=...)`` sets it)
        self.plan: BatchPlan | None = None
        #: saves overlap the next forward/backward: an optimizer step waits for their copy
        self._overlap = False
        self.engine: CheckpointEngine | TorchSaveCheckpointer
        if config.ckpt_mode == "torch-save":
            self.engine = TorchSaveCheckpointer(
                config.ckpt_dir,
                writer=config.rank == 0,
                keep_last=config.keep_last,
                listener=self._on_ckpt_event,
            )
        else:
            # node_shared: the node's ranks read each other's buffers after a restart;
            # parts: a DTensor state spanning nodes is saved as one part per node's volume;
            # local_ranks: the node's ranks share its cores for their snapshot copies
            self.engine = CheckpointEngine(
                Path(config.ckpt_dir),
                keep_last=config.keep_last,
                listener=self._on_ckpt_event,
                node_shared=True,
                parts=node_parts(config),
                local_ranks=config.local_world_size,
            )
        self.telemetry = ShimTelemetry.from_env(
            job=config.job,
            node=config.node,
            rank=config.rank,
            attempt=config.attempt,
            local_rank=config.local_rank,
        )
        self.link: BusLink | None = None
        if config.bus is not None:
            self.link = BusLink(
                settings=config.bus,
                job=config.job,
                node=config.node,
                rank=config.rank,
                heartbeat_period_s=config.heartbeat_period_s,
                on_command=self._on_command,
                commands_since_ns=config.launched_ns,
                local_rank=config.local_rank,
                local_world_size=config.local_world_size,
                attempt=config.attempt,
            )
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGUSR1, self._on_signal)

    @classmethod
    def from_env(cls, **overrides: Any) -> TrainerShim:
        return cls(ShimConfig.from_env(**overrides))

    # ---- TrainingHooks ----------------------------------------------------------------------

    @property
    def layout(self) -> DpLayout:
        """The layout of this job's ranks now (saved with every checkpoint)."""
        return DpLayout(
            world_size=self.config.world_size,
            dp_size=self.config.world_size // self.config.model_parallel_size,
            procs_per_node=self.config.local_world_size,
            num_nodes_per_dp=self.config.num_nodes_per_dp,
        )

    def on_rescale(self, callback: RescaleCallback) -> RescaleCallback:
        """Run ``callback`` at restore when the data-parallel size differs from the saved one
        (in registration order; see :mod:`goodput.shim.rescale` for the built-in rules)."""
        self._rescale_callbacks.append(callback)
        return callback

    def restore(
        self, template_state: dict[str, Any], plan: BatchPlan | None = None
    ) -> RestoreResult | None:
        """The newest checkpoint every rank holds intact; all ranks load the same step.

        ``plan`` is the batch plan of a fresh start; a checkpoint's saved plan replaces it, as
        the rescale callbacks left it. None: nothing to restore (``self.plan`` is ``plan``).
        """
        self.plan = plan
        self.numerics.reset()  # a window begun before an in-process restart is not this one's
        self._busy("checkpoint-load")
        try:
            restored = self._restore_agreed(template_state)
            self._prepare(template_state)
        finally:
            self._busy("")
        if restored is None:
            self._publish_plan(0, self.plan, [], rescaled_from_dp=0)
            return None
        step, state, tier = restored
        result, applied = resolve_restore(
            step,
            state,
            tier=tier,
            layout=self.layout,
            plan=plan,
            callbacks=self._rescale_callbacks,
        )
        self.plan = result.plan
        if result.rescaled:
            assert result.saved_layout is not None
            log.info(
                "rescaled from %d to %d data-parallel ranks at step %d (%s): %s",
                result.saved_layout.dp_size,
                result.layout.dp_size,
                result.step,
                ", ".join(applied) or "no callback",
                result.plan,
            )
        from_dp = result.saved_layout.dp_size if result.rescaled and result.saved_layout else 0
        self._publish_plan(result.step, result.plan, applied, rescaled_from_dp=from_dp)
        return result

    def _publish_plan(
        self, step: int, plan: BatchPlan | None, applied: list[str], rescaled_from_dp: int
    ) -> None:
        """Rank 0 tells the job's events the batch and LR it trains with from ``step``."""
        if plan is not None and self.config.rank == 0:
            self._publish(
                plan_event(self.config, self.layout, step, plan, applied, rescaled_from_dp)
            )

    def _restore_agreed(
        self, template_state: dict[str, Any]
    ) -> tuple[int, dict[str, Any], RestoreSource] | None:
        """The same step on every rank (``goodput.shim.restore_agreement``), at or before a
        numerical rollback's bound (``goodput.shim.rollback``: the newer steps are discarded)."""
        before = self.config.restore_before_step
        restored = restore_agreed(
            bounded(self.engine.latest_complete_step(), before),
            lambda step: self._load(step, template_state),
            rank=self.config.rank,
            where=self.config.ckpt_dir,
        )
        if before is not None and self.config.local_rank == 0:
            discard_after(self.config.ckpt_dir, None if restored is None else restored[0])
        if restored is None:
            log.info("no checkpoint in %s on any rank; starting from scratch", self.config.ckpt_dir)
            return None
        self._last_saved_step = restored[0]
        if self.link is not None:
            self.link.step = restored[0]
        return restored

    @property
    def _volume_tier(self) -> RestoreSource:
        return SHARED if self.config.ckpt_mode == "torch-save" else LOCAL

    def _load(self, step: int, template_state: dict[str, Any]) -> tuple[int, Any, RestoreSource]:
        """``step`` from host memory where it is held intact: this rank's own buffer after an
        in-process restart, the node's other ranks' segments (survivors', and a killed rank's
        until the next save) in any case; what memory lacks or holds corrupt comes from the
        volume (newest intact at or before ``step`` if ``step`` itself cannot be read).
        A DTensor template's local shards are what is restored, never full tensors."""
        if not isinstance(self.engine, CheckpointEngine):
            return (*self.engine.restore(step=step, into=template_state), self._volume_tier)
        own, self._memory_intact = self._memory_intact, False
        # after an in-process restart not merged into the live state: what the checkpoint
        # lacks (the optimizer's moments of later steps) would survive the restore
        outcome = restore_from_host(self.engine, step, template_state, own=own, merge=not own)
        if isinstance(outcome, HostRestore):
            tier: RestoreSource = HOST if outcome.host_bytes else LOCAL
            log.info(
                "restored step %d: %d bytes from host memory, %d from the volume",
                outcome.step,
                outcome.host_bytes,
                outcome.volume_bytes,
            )
            c = self.config
            self._publish(
                restored_report(
                    c.job,
                    c.node,
                    c.rank,
                    outcome.step,
                    tier,
                    outcome.duration_s,
                    outcome.bytes,
                    pinned_bytes=outcome.pinned_bytes,
                )
            )
            return outcome.step, outcome.state, tier
        log.info("restoring from the volume: %s", outcome)
        restored = self.engine.restore(step=step, into=template_state, merge=not own)
        return (*restored, self._volume_tier)

    def step_done(
        self, step: int, step_time_s: float, tokens: int, loss: float, compute_time_s: float = 0.0
    ) -> None:
        if self.link is not None:
            self.link.step = step
        if self._faults.hang.is_set():
            log.error("injected fault: the training loop hangs here (heartbeats go on)")
            self._hang_until_rejoin()
        self._publish(
            schemas.StepDone(
                job=self.config.job,
                node=self.config.node,
                rank=self.config.rank,
                step=step,
                step_time_s=step_time_s,
                tokens=tokens,
                loss=loss,
                world_size=self.config.world_size,
                compute_time_s=compute_time_s,
                in_process_restart=self._rejoins is not None,
            )
        )

    def skips_data(self, step: int) -> bool:
        """Whether the batch of ``step`` is skipped: in a loss spike's window (``skip_steps``)."""
        return skipped(step, self.config.skip_steps)

    def compute_slowdown(self) -> float:
        """The injected straggler's factor while it lasts (``InjectFault`` "slow"), else 1.0."""
        return self._faults.compute_slowdown()

    @property
    def ckpt_every(self) -> int:
        """The checkpoint interval (steps) in force, as every rank agreed on it."""
        return self.schedule.every_steps

    def should_checkpoint(self, step: int) -> bool:
        """Whether to save ``step``: the same answer on every rank, so every rank must call it
        at every step (at agreement steps the ranks vote through the process group)."""
        solo = not grouped()
        if not self.schedule.is_agreement_step(step, solo):
            return self.schedule.decide(step)
        with self._schedule_lock:
            ballot = self.schedule.vote()
        every_before = self.schedule.every_steps
        due = self.schedule.decide(step, ballot if solo else all_reduce_min(ballot))
        if self.schedule.every_steps != every_before:
            log.info("checkpoint interval now %d steps from step %d", self.ckpt_every, step + 1)
        return due

    def guard(self, optimizer: torch.optim.Optimizer) -> None:
        """Overlap every later save with training: the copy into host memory runs during the
        next forward/backward and ``optimizer.step()`` first waits for it, so a save's stall
        is the hand-over, not the copy (``CheckpointEngine.guard``). Only where nothing but
        this optimizer changes the saved state (batch norm's running statistics change in
        the forward). The torch-save baseline ignores it."""
        if isinstance(self.engine, CheckpointEngine):
            self.engine.guard(optimizer)
            self._overlap = True

    def _prepare(self, state: dict[str, Any]) -> None:
        """Allocate, touch and pin the save's host buffer outside any step; a failure only
        leaves that cost to the first save (which reports its own problems)."""
        if not isinstance(self.engine, CheckpointEngine):
            return
        try:
            # the saved metadata is plain values: it adds no bytes to the buffer
            self.engine.prepare(
                state, dp_rank=self.config.local_rank, dp_world=self.config.local_world_size
            )
        except (RuntimeError, MemoryError, OSError) as exc:
            log.warning("checkpoint buffer not prepared before the first save: %s", exc)

    def save(self, state: dict[str, Any], step: int) -> None:
        """Snapshot ``state`` for step ``step`` and return; persisting goes on in background
        (with ``guard``, the snapshot's copy too, until the guarded optimizer step)."""
        saved = with_metadata(state, CheckpointMetadata(layout=self.layout, plan=self.plan))
        rank, world = self.config.local_rank, self.config.local_world_size
        self._busy("checkpoint-save")
        try:
            if isinstance(self.engine, CheckpointEngine):
                self.engine.save(saved, step, overlap=self._overlap, dp_rank=rank, dp_world=world)
            else:
                self.engine.save(saved, step, dp_rank=rank, dp_world=world)
        finally:
            self._busy("")
        self._last_saved_step = step

    def should_stop(self) -> bool:
        return bool(self._stop_reason)

    def finish(self, state: dict[str, Any], step: int) -> None:
        """Save the final state unless already saved, wait until durable, flush events."""
        if self._last_saved_step != step:
            self.save(state, step)
        self._busy("checkpoint-save")
        self.engine.close()
        self._busy("")
        if self._stop_reason.startswith("signal"):
            self.exit_code = EXIT_TERMINATED
        if self.link is not None:
            self.link.close()

    # ---- in-process restart (goodput.shim.inprocess) ------------------------------------------

    def run(self, job: Any, total_steps: int, **options: Any) -> RunOutcome:
        """Drive ``job`` (a :class:`~goodput.shim.inprocess.ResumableJob`) to ``total_steps``
        with in-process restart; see :func:`goodput.shim.inprocess.run_in_process`."""
        return run_in_process(self, job, total_steps, **options)

    def bus_ports(self) -> frozenset[int]:
        """The ports of the bus's servers: a process group's abort never cuts those
        connections (:mod:`goodput.shim.group_sockets`)."""
        return self.link.settings.ports() if self.link is not None else frozenset()

    def enable_in_process_restart(self) -> RejoinMailbox:
        if self._rejoins is None:
            self._rejoins = RejoinMailbox(self.config.attempt)
        return self._rejoins

    def rejoin_pending(self) -> bool:
        return self._rejoins is not None and self._rejoins.pending

    def set_busy(self, what: str) -> None:
        self._busy(what)

    def answer_rejoin(
        self, command: schemas.Rejoin, *, ok: bool, detail: str = "", regroup_s: float = 0.0
    ) -> None:
        """Tell the actuator whether this rank joined ``command``'s group; once it has, it is
        in that attempt and its checkpoint schedule starts over as a cold start's would."""
        if ok:
            self._memory_intact = True
            self.config.attempt = command.attempt
            with self._schedule_lock:
                self.schedule = CheckpointSchedule(self.config.ckpt_every)
            self._faults.hang.clear()
        self._publish(
            schemas.RankRejoined(
                job=self.config.job,
                node=self.config.node,
                rank=self.config.rank,
                pid=os.getpid(),
                attempt=command.attempt,
                regroup_s=regroup_s,
                ok=ok,
                detail=detail,
            )
        )

    def _on_rejoin(self, command: schemas.Rejoin) -> None:
        if command.attempt <= self.config.attempt:
            # a rank started into that attempt (a standby assigned while the survivors are
            # told to rejoin) sees its Rejoin too: it is already where the command leads
            log.info(
                "ignoring Rejoin for attempt %d: this rank is at attempt %d",
                command.attempt,
                self.config.attempt,
            )
            return
        if self._rejoins is None:
            detail = "its training loop is not the shim's (shim.run): no in-process restart"
            self.answer_rejoin(command, ok=False, detail=detail)
            return
        self._rejoins.offer(command)

    def _hang_until_rejoin(self) -> None:
        """The injected hang: blocks the loop (heartbeats go on) until the process is killed
        or, under ``run``, a Rejoin unwinds the step."""
        rejoins = self._rejoins
        while rejoins is None:  # nothing can wake it: only the process's end
            threading.Event().wait()
        while not rejoins.pending:
            time.sleep(0.05)
        raise RestartRequested("woken from the injected hang by a Rejoin")

    # ---- inputs -------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stop_reason = f"signal {signal.Signals(signum).name}"

    def _on_command(self, command: schemas.Command) -> None:
        match command:
            case schemas.CheckpointNow():
                with self._schedule_lock:
                    self.schedule.request_now()
            case schemas.Stop() if not command.nodes or self.config.node in command.nodes:
                self._stop_reason = f"stop command: {command.reason}"
            case schemas.SetCheckpointInterval():
                log.info(
                    "checkpoint interval %d steps received (%s); in force once every rank has it",
                    command.every_steps,
                    command.rationale,
                )
                with self._schedule_lock:
                    self.schedule.receive_interval(command.ts, command.every_steps)
            case schemas.Rejoin():
                self._on_rejoin(command)
            case schemas.InjectFault() if command.fault in RANK_FAULT_KINDS:
                self._faults.apply(command)
            case schemas.Rescale():
                # the world size changes by relaunch: save now so the new group loses nothing
                self._stop_reason = f"rescale {command.old_world_size} → {command.new_world_size}"

    def _busy(self, what: str) -> None:
        if self.link is not None:
            self.link.busy = what

    # ---- outputs ------------------------------------------------------------------------------

    def _publish(self, event: schemas.Event) -> None:
        if self.link is not None:
            self.link.publish(event, self.telemetry.context())
        self.telemetry.observe(event)

    def _on_ckpt_event(self, event: ckpt_events.CheckpointEvent) -> None:
        c = self.config
        report = checkpoint_report(event, c.job, c.node, c.rank, self._volume_tier)
        if report is not None:
            self._publish(report)
