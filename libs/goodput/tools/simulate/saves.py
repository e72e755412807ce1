"""The world's checkpoint saves: what the job waits for, and what the controller and
``goodput report`` hear of each.

A mixin of :class:`goodput.tools.simulate.world.World` (it uses the world's clock, ranks,
stream and controller state), kept apart so each file has one job. A save the schedule makes
stalls training for as long as the job waits for it (a replay's: every rank's stall, of which
the controller hears rank 0's). A replay also books the saves its run made outside its steps
— the first start's save of step 0, a stopped attempt's (SIGTERM) and the last step's at the
job's end — at no extra time: their seconds are inside the measured start-up, relaunch and
shutdown, and ``goodput report`` charges them as saves, so the replay's stream says so too.
"""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.jobstate.folds import observe_event
from goodput.tools.simulate import messages as msg
from goodput.tools.simulate.checkpoints import CheckpointSystem
from goodput.tools.simulate.records import NS
from goodput.tools.simulate.world_parts import WorldParts

#: what a rank is busy with while it saves (its heartbeats say so)
SAVE = "checkpoint-save"


class SavesMixin(WorldParts):
    def _saved(self, gen: int, stall_s: float, waited_s: float) -> None:
        """A save the job waited ``waited_s`` for, rank 0's of ``stall_s``."""
        if gen != self._gen:
            return
        capture = self.ckpt.capture(self.step, self.now)
        self.phase = "running"
        for fed in self._fed.values():
            if fed.busy == SAVE:
                fed.busy = ""  # its next step tells the sensor
        saved, *others = self._save_events(self.now, stall_s, waited_s)
        self._tell(saved)
        self.stream += others
        self.state = observe_event(self.state, saved, self.now)
        durable = CheckpointSystem.first_durable_ns(capture)
        node = saved.node
        self._at(durable, self._persisted, capture.step, (durable - capture.taken_ns) / NS, node)
        self._next_step = self.now + self._step_ns()

    def _persisted(self, step: int, duration_s: float, node: str) -> None:
        persisted = msg.checkpoint_persisted(
            node, self.now, step, max(duration_s, self.ckpt.stall_s)
        )
        self.stream.append(persisted)
        self.state = observe_event(self.state, persisted, self.now)
        self._apply(self.controller.recommend_checkpoint_interval(self.state, self.now))

    def _save_events(
        self, end_ns: int, stall_s: float, waited_s: float
    ) -> list[schemas.CheckpointSaved]:
        """Rank 0's save of the current step, ending at ``end_ns``, and, where the job waited
        longer for it (a replay's), the union of every rank's as the last rank's save."""
        ref = self._fed.get(0)
        active = self.actuator.membership.active
        node = ref.node if ref is not None else active[0]
        saved = msg.checkpoint_saved(node, end_ns, self.step, stall_s, self.job.state_gb_per_node)
        if waited_s <= stall_s:
            return [saved]
        return [saved, msg.slowest_saved(active, self.job.gpus_per_node, saved, waited_s)]

    def _book_unpaced_save(self, *, after: bool) -> None:
        """A save a replayed run made of the current step outside its steps, for ``goodput
        report`` alone: ending now (the first start's, inside its start-up) or ``after`` now
        (a stopped attempt's, or the last step's, inside the relaunch or the shutdown)."""
        measured = self._pace.saves.get(self.step)
        if measured is not None:
            stall_s, waited_s = measured
            end_ns = self.now + (int(waited_s * NS) if after else 0)
            self.stream += self._save_events(end_ns, stall_s, waited_s)
