"""What the world's mixins (:mod:`.faults`, :mod:`.decisions`, :mod:`.saves`) read and call of
one another and of :class:`~goodput.tools.simulate.world.World`.

Each mixin subclasses :class:`WorldParts`, so a type checker checks every attribute a mixin
reads or assigns, and every method it calls on another part, against these declarations, and
``World``'s own assignments against the same types. The methods are abstract: ``World`` cannot
be made while one of them is missing, and each call reaches the mixin's or the world's method,
which come before ``WorldParts`` in ``World``'s method resolution order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable

from goodput import schemas
from goodput.supervisor.control.engine import Controller, Outcome
from goodput.supervisor.jobstate.model import JobState
from goodput.tools.simulate.actuator import Execution, SimActuator
from goodput.tools.simulate.checkpoints import CheckpointSystem
from goodput.tools.simulate.fleet import Fault, StepFault
from goodput.tools.simulate.profile import CostProfile, JobSpec
from goodput.tools.simulate.records import FedRank, Pace, Slowing
from goodput.tools.simulate.strategies import Strategy


class WorldParts(ABC):
    # the job, its costs and the real deciders
    job: JobSpec
    profile: CostProfile
    strategy: Strategy
    actuator: SimActuator
    ckpt: CheckpointSystem
    controller: Controller
    state: JobState
    # the clock, the training and what ``goodput report`` reads
    now: int
    step: int
    phase: str
    stream: list[schemas.Event]
    interruptions: int
    decisions: int
    rules: Counter[str]
    _gen: int
    _next_step: int | None
    _failure_ns: int | None
    _stopped: bool
    _step_s: float
    _pace: Pace
    _latency: int
    # the ranks the sensor follows and the faults in force
    _fed: dict[int, FedRank]
    _broken: dict[str, str]
    _corrupt: dict[str, int]
    _compute_factor: dict[str, float]
    _straggling: dict[str, Slowing]
    _straggle_changes: int
    _slow_key: tuple[int, int] | tuple[()]
    _slow: float
    _stepwise: list[Slowing]
    _step_faults: list[StepFault]
    _repairs_at_step: list[tuple[int, str]]

    # the world's loop, sensor feed and training (world.py)
    @abstractmethod
    def _at(self, when: int, action: Callable[..., None], *args: object) -> None: ...
    @abstractmethod
    def _feed(self, event: schemas.Event) -> None: ...
    @abstractmethod
    def _feed_later(self, delay_ns: int, event: schemas.Event) -> None: ...
    @abstractmethod
    def _tell(self, event: schemas.Event) -> None: ...
    @abstractmethod
    def _beat(self, rank: int, fed: FedRank) -> None: ...
    @abstractmethod
    def _step_ns(self) -> int: ...
    @abstractmethod
    def _launch(self, execution: Execution | None) -> None: ...

    # the faults (faults.py)
    @abstractmethod
    def _fault(self, fault: Fault) -> None: ...
    @abstractmethod
    def _fail(self) -> None: ...
    @abstractmethod
    def _manifest(self, position: int, node: str, kind: str) -> None: ...
    @abstractmethod
    def _register(self, rank: int, fed: FedRank) -> FedRank: ...
    @abstractmethod
    def _watch_straggler(self, position: int, node: str) -> None: ...
    @abstractmethod
    def _slowdown(self, step: int) -> float: ...
    @abstractmethod
    def _straggler_ends(self, node: str) -> None: ...
    @abstractmethod
    def _gpus_reset(self, nodes: list[str]) -> None: ...
    @abstractmethod
    def _repaired(self, node: str) -> None: ...

    # the controller and the actuator (decisions.py)
    @abstractmethod
    def _apply(self, outcome: Outcome) -> None: ...
    @abstractmethod
    def _due(self) -> None: ...
    @abstractmethod
    def _stop_group(self, execution: Execution) -> None: ...
    @abstractmethod
    def _standbys_ready(self) -> None: ...
    @abstractmethod
    def _executed(self, execution: Execution) -> None: ...

    # the saves (saves.py)
    @abstractmethod
    def _persisted(self, step: int, duration_s: float, node: str) -> None: ...
    @abstractmethod
    def _save_events(
        self, end_ns: int, stall_s: float, waited_s: float
    ) -> list[schemas.CheckpointSaved]: ...
    @abstractmethod
    def _book_unpaced_save(self, *, after: bool) -> None: ...
