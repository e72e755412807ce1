"""What `goodput status` shows of one job at one moment: the snapshot the model folds its
events into, the structs ``--json`` prints and the panels render."""

from __future__ import annotations

from typing import Literal

import msgspec

from goodput.schemas.tiers import HOST, LOCAL, OBJECT_STORE, PEER, TIERS, RestoreSource

NodeRole = Literal["active", "spare", "failed", "unknown"]
CheckpointStage = Literal["saved", "persisted", "replicated", "backed_up"]
#: the tier each stage leaves a copy in (``schemas.tiers``), in the order a restore prefers them
STAGE_TIERS: dict[CheckpointStage, RestoreSource] = {
    "saved": HOST,
    "persisted": LOCAL,
    "replicated": PEER,
    "backed_up": OBJECT_STORE,
}
#: what a person reads for each stage's copy
TIER_TITLES: dict[CheckpointStage, str] = {
    stage: TIERS[tier].title for stage, tier in STAGE_TIERS.items()
}


class RankView(msgspec.Struct, kw_only=True):
    rank: int
    node: str
    pid: int
    attempt: int
    running: bool = True
    exit_code: int | None = None
    exit_signal: int | None = None
    step: int | None = None
    #: set while the rank is inside a checkpoint save or load (from its heartbeats)
    busy: str = ""


class NodeView(msgspec.Struct, kw_only=True):
    name: str
    role: NodeRole
    ranks: list[int]
    pids: list[int]
    #: seconds since a rank of this node was last heard (heartbeat, step, start); None: never
    last_heard_age_s: float | None = None
    host_healthy: bool | None = None
    gpu_available: bool | None = None
    host_faults: list[str] = msgspec.field(default_factory=list)
    host_detail: str = ""
    host_age_s: float | None = None


class TierView(msgspec.Struct, kw_only=True):
    """The newest checkpoint one tier reported."""

    tier: CheckpointStage
    step: int
    age_s: float
    #: ranks (saved/persisted), peers (replicated) or URIs (backed up) holding that step
    holders: list[str]


class RestoreView(msgspec.Struct, kw_only=True):
    step: int
    tier: str
    age_s: float
    node: str
    fallbacks: list[str]
    #: the page-locked memory its copies to the GPU went through (released since; 0: none)
    pinned_bytes: int = 0


class PlanView(msgspec.Struct, kw_only=True):
    """The batch and LR the trainers run with (their newest ``TrainingPlan``)."""

    step: int
    age_s: float
    dp_size: int
    global_batch: int
    micro_batch: int
    accumulation_steps: int
    lr: float
    #: the data-parallel size before the rescale that made this plan (0: no rescale)
    rescaled_from_dp: int
    callbacks: list[str]


class StepProgress(msgspec.Struct, kw_only=True):
    step: int | None = None
    #: reference-rank steps per second over the last model.RATE_WINDOW_S (None: fewer than 2 steps)
    steps_per_s: float | None = None
    step_time_s: float | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    last_step_age_s: float | None = None


class SignalView(msgspec.Struct, kw_only=True):
    age_s: float
    signal: str
    severity: str
    node: str
    rank: int | None
    detail: str


class DecisionView(msgspec.Struct, kw_only=True):
    age_s: float
    policy: str
    rule: str
    reason: str
    commands: int
    error: str


class ActionView(msgspec.Struct, kw_only=True):
    age_s: float
    action: str
    ok: bool
    detail: str
    duration_s: float


class GoodputView(msgspec.Struct, kw_only=True):
    goodput_pct: float
    productive_s: float
    total_s: float
    ettr: float
    interruptions: int
    mttr_s: float | None
    #: the largest badput categories (title -> seconds), largest first
    top_badput: dict[str, float]
    #: how old the figures are: they are recomputed every model.GOODPUT_EVERY_S at most
    computed_age_s: float


class JobSnapshot(msgspec.Struct, kw_only=True):
    job: str
    state: str
    attempt: int
    world_size: int
    procs_per_node: int
    detail: str
    events: int
    step: StepProgress
    nodes: list[NodeView]
    ranks: list[RankView]
    checkpoints: list[TierView]
    last_restore: RestoreView | None
    #: the batch plan in force (None: the trainer reported none)
    plan: PlanView | None
    last_checkpoint_failure: str
    signals: list[SignalView]
    decisions: list[DecisionView]
    actions: list[ActionView]
    goodput: GoodputView | None
    #: why there is no goodput yet (no training events) or why computing it failed
    goodput_note: str = ""
