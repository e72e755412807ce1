"""The world's side of the controller and the actuator: a signal decided after the profile's
decision time, the commands applied to the simulated actuator, and what each execution does
to the worker group (stops it, relaunches it, or stops every rank when a warm restart failed).

A mixin of :class:`goodput.tools.simulate.world.World`, kept apart so each file has one job (the
world runs the loop, the sensor feed and training; :mod:`.faults` the faults).
"""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.control.engine import Outcome
from goodput.supervisor.jobstate.folds import observe_event
from goodput.tools.simulate import messages as msg
from goodput.tools.simulate.actuator import Execution
from goodput.tools.simulate.profile import SimulateError
from goodput.tools.simulate.records import Pace
from goodput.tools.simulate.world_parts import WorldParts


class DecisionsMixin(WorldParts):
    # ---- the controller ---------------------------------------------------------------------

    def _decide(self, signal: schemas.Signal) -> None:
        self._apply(self.controller.handle(self.state, signal, self.now))

    def _apply(self, outcome: Outcome) -> None:
        self.state = outcome.state
        decision = outcome.decision
        if decision is None:
            return
        self.decisions += 1
        self.rules[decision.rule] += 1
        self.stream.append(decision)
        if decision.error and self.strategy.policy and self.controller.script is not None:
            raise SimulateError(decision.error)
        relaunching = False
        for command in outcome.commands:
            if isinstance(command, schemas.SetCheckpointInterval):
                self.ckpt.set_interval(command.every_steps)
                continue
            execution = self.actuator.execute(command, self.now)
            if execution is None:
                continue
            if execution.relaunch:
                relaunching = True
                self._at(execution.stops_ns, self._stop_group, execution)
                if execution.cost is not None and execution.cost.trained_on_steps:
                    # it trains on, slower, its steps ending as measured from the decision (the
                    # one in flight too: else it may miss the stop, and the step it saved)
                    self._step_s = execution.cost.trained_on_pace_s
                    self._pace = Pace(saves=self._pace.saves)
                    if self._next_step is not None:
                        self._next_step = self.now + self._step_ns()
            self._at(execution.done_ns, self._executed, execution)
            if execution.standbys_ready_ns is not None:
                self._at(execution.standbys_ready_ns, self._standbys_ready)
        if not relaunching and decision.signal_id and self.phase in ("detect", "decide"):
            self.phase = "down"  # stalled and nobody restarts it: job down
        if self.state.deferred:
            self._at(min(d.until_ts for d in self.state.deferred), self._due)

    def _due(self) -> None:
        for outcome in self.controller.due(self.state, self.now):
            self._apply(outcome)

    # ---- the actuator -----------------------------------------------------------------------

    def _stop_group(self, execution: Execution) -> None:
        """The worker group stops: a running job saves first (SIGTERM), a failed one is lost."""
        if self._failure_ns is None and self.phase in ("running", "saving"):
            captures = self.ckpt.captures
            saved = bool(captures) and captures[-1].step == self.step
            self.ckpt.capture(self.step, self.now)
            if not saved:  # a step saved already is not saved twice
                self._book_unpaced_save(after=True)
        self._gen += 1
        self._next_step = None
        reason = schemas.kind_of(type(execution.command))
        for rank, fed in self._fed.items():
            self._feed(
                msg.rank_exited(
                    fed.node, rank, self.now, self.actuator.attempt - 1, signal=9, reason=reason
                )
            )
        self._fed.clear()
        self.phase = "restart"

    def _standbys_ready(self) -> None:
        """Standbys became ready: the actuator reports the job's status, as the real one does."""
        self.state = observe_event(self.state, self.actuator.status(self.now), self.now)

    def _executed(self, execution: Execution) -> None:
        if execution.killed:
            self._stop_group(execution)  # a failed in-process restart stops every rank
        if execution.relaunch:
            self.ckpt.relaunched()  # the ranks start before the actuator answers
        self.state = observe_event(self.state, self.actuator.status(self.now), self.now)
        self._apply(self.controller.settle(self.state, execution.result, self.now))
        if execution.stopped:
            self._stopped = True
            self.phase = "down"
        elif execution.relaunch:
            if isinstance(execution.command, schemas.Restart):
                self._gpus_reset(list(execution.command.reset_gpus))
            self._launch(execution)
