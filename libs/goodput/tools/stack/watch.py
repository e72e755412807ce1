"""Following a job from its events: progress for people, a summary for machines."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import msgspec
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from goodput import schemas
from goodput.bus import Bus
from goodput.bus.job_events import JobEvents
from goodput.launch.exit_reason import (
    RUN_CANNOT_CONTINUE_EXIT_CODE,
    RUN_FAILED_EXIT_CODE,
    RUN_FINISHED_EXIT_CODE,
)
from goodput.supervisor.policy.builtin import NO_CAPACITY_RULE


@dataclass
class JobWatcher:
    """Keeps the facts a run reports (steps, world sizes, restarts, remediations) as they come.

    Given ``run_start`` (the StartJob it follows), it counts nothing until that run's
    ``RunStarted``: what came before is an earlier run of the same job name. If the actuator
    refuses the start, the watcher ends with state ``refused`` and the reason in ``refusal``.
    A run whose first attempt fails to launch (see :func:`launch_failure`) ends it with state
    ``launch failed`` and the reason in ``refusal``: restarting a command that cannot start
    helps nobody, so its follower stops it rather than watch a crash loop.
    """

    bus: Bus
    job: str
    total_steps: int
    console: Console | None = None
    run_start: schemas.StartJob | None = None
    refusal: str = ""
    step: int = 0
    state: str = "starting"
    attempt: int = 0
    world_size_history: list[int] = field(default_factory=list)
    signals: list[schemas.Signal] = field(default_factory=list)
    decisions: list[schemas.Decision] = field(default_factory=list)
    failed_actions: list[schemas.ActionResult] = field(default_factory=list)
    #: the batch and LR the trainers ran with, one per restore (and rescale)
    training_plans: list[schemas.TrainingPlan] = field(default_factory=list)
    last_status: schemas.JobStatus | None = None
    events: int = 0
    #: monotonic times of rank 0's newest step and of the newest attempt's start
    last_step_at: float = 0.0
    attempt_started_at: float = 0.0

    def __post_init__(self) -> None:
        self.ended = asyncio.Event()
        self._events: JobEvents | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._in_run = self.run_start is None
        self._running_attempt = 0
        #: the run's first attempt, its world size, and its ranks' exits until a step is seen
        self._first_attempt = (0, 0)
        #: the ranks' exits seen before any step (what a launch failure is judged on)
        self.launch_exits: list[schemas.RankExited] = []
        self._held: list[str] = []  # progress lines held while a launch failure is judged
        self._stepped = False

    @property
    def restarts(self) -> int:
        return max(self.attempt - 1, 0)

    async def start(self) -> JobWatcher:
        # a bar is for a terminal: in a log or a pipe its final frame is noise
        if self.console is not None and self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                f"job {self.job}", total=self.total_steps, info="starting"
            )

        self._events = await JobEvents(self.bus, self.job, self._apply, keep=False).start()
        return self

    async def stop(self) -> None:
        if self._events is not None:
            await self._events.stop()
        if self.console is not None and self.state != "launch failed":
            for line in self._held:
                self.console.print(line, soft_wrap=True)
        self._held.clear()
        if self._progress is not None:
            self._progress.stop()

    def say(self, text: str) -> None:
        if self.console is None or self.ended.is_set():
            return
        if self._judging_launch():
            self._held.append(text)  # a launch failure replaces them with one line
            return
        for line in [*self._held, text]:
            self.console.print(line, soft_wrap=True)
        self._held.clear()

    def _judging_launch(self) -> bool:
        """A rank exited before any step: whether the run failed to launch is not known yet."""
        return bool(self.launch_exits) and not self._stepped

    def _apply(self, event: schemas.Event) -> None:
        if not self._in_run:
            self._before_run(event)
            return
        if self.state == "launch failed":
            return  # the verdict stands: the stop `run` sends next reports "stopped"
        self.events += 1
        match event:
            case schemas.StepDone():
                self._stepped = True
                if event.rank == 0:
                    # after a restore the step count goes back: show where training really is
                    self.step = event.step
                    self.last_step_at = time.monotonic()
            case schemas.RankExited() if not self._stepped and not self.ended.is_set():
                self.launch_exits.append(event)
                self._check_launch()
            case schemas.JobStatus():
                self.last_status = event
                # an attempt counts once it runs: a status from mid-relaunch (a standby that
                # became ready) already carries the new attempt, still "restarting"
                if event.state == "running" and event.attempt != self._running_attempt:
                    if not self._running_attempt:
                        self._first_attempt = (event.attempt, event.world_size)
                        self._check_launch()  # its ranks' exits may have come first
                    self._running_attempt = event.attempt
                    self.world_size_history.append(event.world_size)
                    self.attempt_started_at = time.monotonic()
                self.attempt = event.attempt
                self.state = event.state
                self.say(
                    f"[cyan]job[/] attempt {event.attempt} {event.state}: world size "
                    f"{event.world_size} on {', '.join(event.active_nodes)}"
                    + (f" — {event.detail}" if event.detail else "")
                )
                if event.state in schemas.ENDED_JOB_STATES:
                    self.ended.set()
            case schemas.Signal():
                self.signals.append(event)
                self.say(
                    f"[yellow]signal[/] {event.signal} on {event.node or 'job'}"
                    + (f" rank {event.rank}" if event.rank is not None else "")
                    + f": {event.detail}"
                )
            case schemas.TrainingPlan():
                self.training_plans.append(event)
                if event.rescaled_from_dp:
                    self.say(
                        f"[cyan]rescaled[/] {event.rescaled_from_dp} → {event.dp_size} "
                        f"data-parallel ranks at step {event.step}: global batch "
                        f"{event.global_batch}, {event.accumulation_steps} accumulation steps, "
                        f"lr {event.lr:.3g} ({', '.join(event.callbacks) or 'no callback'})"
                    )
            case schemas.Decision():
                self.decisions.append(event)
                self.say(f"[magenta]decision[/] {event.rule}: {event.reason}")
                if event.error:
                    self.say(f"[red]policy error[/] {event.error}")
            case schemas.ActionResult(ok=False):
                self.failed_actions.append(event)
                if event.action == "start_job":  # refused: no job will ever report
                    self.state, self.refusal = "launch failed", event.detail
                    self.ended.set()
                self.say(f"[red]action failed[/] {event.action}: {event.detail}")
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task,
                completed=self.step,
                info=f"attempt {self.attempt} · world {self.world_size_history[-1] if self.world_size_history else '-'} · {self.state}",
            )

    def _check_launch(self) -> None:
        if self._stepped or self.ended.is_set():
            return
        reason = launch_failure(self.launch_exits, *self._first_attempt)
        if reason:
            self.state, self.refusal = "launch failed", reason
            self.ended.set()

    def _before_run(self, event: schemas.Event) -> None:
        """Wait for our run's start, or for the actuator's refusal to start it."""
        assert self.run_start is not None
        match event:
            case schemas.RunStarted() if event.run_id == self.run_start.run_id:
                self._in_run = True
                self.events += 1
            case schemas.ActionResult(ok=False) if event.command_id == self.run_start.command_id:
                self.state, self.refusal = "refused", event.detail
                self.ended.set()

    async def wait(self, timeout_s: float) -> bool:
        """True if the job ended within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.ended.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self.ended.wait(), min(remaining, 1.0))
            except TimeoutError:
                continue
        return True


def launch_failure(exits: list[schemas.RankExited], attempt: int, world_size: int) -> str:
    """Why the run's first attempt failed to launch, or "" while it has not (yet).

    ``exits``: the rank exits seen before any rank finished a step. Every rank of the first
    ``attempt`` (of ``world_size`` ranks) having exited with the same non-zero code before any
    step is a command that cannot start (a missing script, an import error, a bad flag): the
    same on each try, not a crash a restart cures. A rank's exit counts from that attempt on:
    the controller may already have restarted the survivors in process when they fail too.
    """
    if not attempt or not world_size:
        return ""
    codes = {e.rank: e.exit_code for e in exits if e.attempt >= attempt and not e.expected_reason}
    if len(codes) < world_size:
        return ""
    distinct = set(codes.values())
    if len(distinct) != 1:
        return ""
    code = distinct.pop()
    if code is None or code == 0:
        return ""
    return f"every rank exited with exit code {code} before the first step (attempt {attempt} on)"


def run_exit_code(state: str, decisions: list[schemas.Decision]) -> int:
    """The exit status of `goodput run` for a run that ended in ``state`` after ``decisions``:
    finished, cannot continue (the last decision that sent commands stopped the job for want of
    healthy nodes: a new allocation may go on from the checkpoints), or failed for good."""
    if state == "finished":
        return RUN_FINISHED_EXIT_CODE
    acting = [d for d in decisions if d.command_ids]
    if state == "stopped" and acting and acting[-1].rule == NO_CAPACITY_RULE:
        return RUN_CANNOT_CONTINUE_EXIT_CODE
    return RUN_FAILED_EXIT_CODE


def summary(watcher: JobWatcher) -> dict:
    """What `goodput run --json` and the demo report about a job that was followed."""
    status = watcher.last_status
    return {
        "job": watcher.job,
        "state": watcher.state,
        "steps": watcher.step,
        "restarts": watcher.restarts,
        "world_size_history": watcher.world_size_history,
        "signals": [msgspec.to_builtins(s) for s in watcher.signals],
        "decisions": [msgspec.to_builtins(d) for d in watcher.decisions],
        #: the commands the actuator refused or failed (a policy that knows what the job and
        #: its backend support sends none it would refuse)
        "failed_actions": [msgspec.to_builtins(a) for a in watcher.failed_actions],
        "training_plans": [msgspec.to_builtins(p) for p in watcher.training_plans],
        "failed_nodes": status.failed_nodes if status else [],
    }
