"""What a backend reaches the rest of the system through: its event sink and the requests it
may make of other parts over the bus, given to it when it is built."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from goodput import schemas
from goodput.launch.rank_env import RankEnv

EventSink = Callable[[schemas.Event], Awaitable[None]]
#: fills a node's local volume with the newest complete checkpoint (node, its index in the
#: launch order: the part of a checkpoint sharded across nodes it holds, the node count, and
#: a numerical rollback's bound: the newest before that step, else None); returns what it did
NodePreparer = Callable[[str, int, int, int | None], Awaitable[str]]
#: resets GPUs of a node (node, GPU indexes or [] for all, the run and attempt whose ranks
#: stopped); returns whether it succeeded and what happened
GpuResetter = Callable[[str, list[int], str, int], Awaitable[tuple[bool, str]]]
#: sends a Rejoin to the trainers and collects the answers of the given ranks until every one
#: answered or the deadline (seconds) passed; returns the answers by rank
RejoinRound = Callable[
    [schemas.Rejoin, set[int], float], Awaitable[dict[int, schemas.RankRejoined]]
]
#: hands a pod standby (its assignment subject) a rank's environment; returns "" when the
#: standby took it, else why not (the rank then starts cold)
AssignStandby = Callable[[str, RankEnv], Awaitable[str]]
#: returns once the job publishes a step after the call (the job trains again): standbys are
#: started then, never while the ranks start up, whom they would slow down
NextStep = Callable[[], Awaitable[None]]
#: the step windows a run skips from its start: those its earlier restarts were told (a run
#: started again by a restarted actuator), none for a new run
RunSkipsReader = Callable[[schemas.StartJob], Awaitable[tuple[schemas.StepWindow, ...]]]


@dataclass(frozen=True)
class BusPorts:
    """What a backend reaches the rest of the system through, given when it is built: the
    sink of its events, and each request it may make of another part over the bus (None where
    the deployment has no such part: its capabilities then say it cannot)."""

    emit: EventSink
    #: the node's checkpoint tier fills its volume before a launch (None: no restore step)
    prepare_node: NodePreparer | None = None
    #: the host monitors' GPU reset, between stopping and launching ranks
    reset_gpus: GpuResetter | None = None
    #: how Rejoin commands reach the ranks (None: no warm restart)
    rejoin: RejoinRound | None = None
    #: when the job trains again (None: standbys start right away)
    next_step: NextStep | None = None
    #: how a pod standby is handed its rank (None: pod standbys start cold)
    assign_standby: AssignStandby | None = None
    #: where a run's skip windows are read back from (None: a run starts with none)
    run_skips: RunSkipsReader | None = None
