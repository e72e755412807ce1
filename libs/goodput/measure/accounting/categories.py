"""The badput categories: stable keys, human titles, and their ml-goodput-measurement names.

The keys are part of the report's JSON contract; never rename one. The order is the order
reports list them in (roughly the life of an interruption, then the steady-state losses).
"""

from __future__ import annotations

import msgspec

PRODUCTIVE = "productive"

CHECKPOINT_SAVE = "checkpoint_save"
WASTED_PROGRESS = "wasted_progress"
NUMERICAL_ROLLBACK = "numerical_rollback"
FAILURE_DETECTION = "failure_detection"
DECISION = "decision"
RESTART = "restart_reprovision"
CHECKPOINT_RESTORE = "checkpoint_restore"
PROGRAM_STARTUP = "program_startup"
STRAGGLER = "straggler_slowdown"
SCALED_DOWN = "scaled_down_idle"
JOB_DOWN = "job_down"


class Category(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    title: str
    #: the nearest ml-goodput-measurement ``BadputType`` (or its elastic equivalent)
    google_name: str


BADPUT_CATEGORIES: tuple[Category, ...] = (
    Category(
        key=CHECKPOINT_SAVE,
        title="checkpoint save stall",
        google_name="UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    ),
    Category(
        key=WASTED_PROGRESS,
        title="steps lost and recomputed",
        google_name="WASTED_PROGRESS_FROM_DISRUPTION",
    ),
    # A rollback for a NaN, a loss spike or a corrupt replica: the work it threw away and its
    # restore. ml-goodput-measurement has no numerical type; its nearest is the progress a
    # disruption wasted, which is what most of this time is (the restore being the smaller
    # part). Listed beside wasted_progress: both are the work an interruption throws away.
    Category(
        key=NUMERICAL_ROLLBACK,
        title="numerical rollback",
        google_name="WASTED_PROGRESS_FROM_DISRUPTION",
    ),
    Category(
        key=FAILURE_DETECTION,
        title="failure detection",
        google_name="INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    ),
    Category(
        key=DECISION,
        title="remediation decision",
        google_name="INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    ),
    Category(
        key=RESTART,
        title="restart / reprovision",
        google_name="INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    ),
    Category(
        key=CHECKPOINT_RESTORE,
        title="checkpoint load",
        google_name="UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    ),
    Category(
        key=PROGRAM_STARTUP,
        title="program startup / reinitialization",
        google_name="PROGRAM_STARTUP (elastic reinitialization)",
    ),
    Category(key=STRAGGLER, title="straggler slowdown", google_name="OTHER (step time deviation)"),
    Category(
        key=SCALED_DOWN,
        title="capacity idle while scaled down",
        google_name="OTHER (elastic scale down)",
    ),
    Category(key=JOB_DOWN, title="job down, no progress", google_name="OTHER"),
)

BADPUT_KEYS: tuple[str, ...] = tuple(category.key for category in BADPUT_CATEGORIES)
TITLES: dict[str, str] = {category.key: category.title for category in BADPUT_CATEGORIES} | {
    PRODUCTIVE: "productive"
}
