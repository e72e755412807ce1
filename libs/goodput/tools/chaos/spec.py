"""What a fault is, as data: one msgspec struct per fault kind (tag ``kind``).

The same structs describe a fault given on the command line and a fault in a scenario file,
so both go through one validation and one implementation. Timing fields (``at_s``,
``rate_per_day``, ``clear_after_s``) only mean something inside a scenario.
A target left out (``rank``/``node`` = None) is chosen at random when the fault fires.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from goodput import schemas

#: the longest any scenario or fault may last (30 days): every time is finite and bounded
MAX_SECONDS = 30 * 86_400.0
#: the highest Poisson rate, per (compressed) day
MAX_RATE_PER_DAY = 1e6

NonNegative = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
Positive = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]
RankId = Annotated[int, msgspec.Meta(ge=0, le=1 << 20)]


class FaultSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="kind"):
    #: scenario only: fire once, this many seconds after the scenario starts
    at_s: NonNegative | None = None
    #: scenario only: fire as a Poisson process with this mean rate per (compressed) day
    rate_per_day: Annotated[float, msgspec.Meta(gt=0, le=MAX_RATE_PER_DAY)] | None = None
    #: scenario only: undo the fault this many seconds after it fired (clearable faults)
    clear_after_s: Positive | None = None

    @property
    def kind(self) -> str:
        return schemas.kind_of(type(self))


class KillRank(FaultSpec, tag="kill-rank", kw_only=True):
    """SIGKILL one rank process: a crash the job can restart from (in-job restart)."""

    rank: RankId | None = None


class FailNode(FaultSpec, tag="fail-node", kw_only=True):
    """Make a node's host monitor report node_down, then SIGKILL every rank there: a lost host."""

    node: str | None = None
    clear: bool = False


class GpuXid(FaultSpec, tag="gpu-xid", kw_only=True):
    """The node's host monitor reports a critical GPU XID error (79: fell off the bus; the
    ones ``goodput.gpu_faults`` calls reset-correctable, e.g. 48, lead to a GPU reset)."""

    node: str | None = None
    xid: Annotated[int, msgspec.Meta(ge=1, le=1 << 16)] = 79
    clear: bool = False


class HostFault(FaultSpec, tag="host-fault", kw_only=True):
    """The node's host monitor reports any host fault it knows (disk_full, thermal, …)."""

    fault: str
    node: str | None = None
    detail: str = ""
    clear: bool = False


class SlowRank(FaultSpec, tag="slow-rank", kw_only=True):
    """A straggler: the rank's compute takes factor× as long (its trainer shim stretches it), or
    for a rank without fault injection it runs 1/factor of the time (SIGSTOP/SIGCONT cycle)."""

    rank: RankId | None = None
    factor: Annotated[float, msgspec.Meta(gt=1, le=1000)] = 2.0
    duration_s: Positive = 60.0
    period_s: Annotated[float, msgspec.Meta(ge=0.01, le=3600)] = 0.2
    #: "compute": the shim slows the rank's own compute, exactly factor× (needs fault
    #: injection); "sigstop": the duty cycle, which also stops the rank while it waits for its
    #: peers, so its compute grows less than factor×; "auto": compute where the rank allows it
    method: Literal["auto", "compute", "sigstop"] = "auto"


class HangRank(FaultSpec, tag="hang-rank", kw_only=True):
    """The trainer shim blocks the rank's training loop while its heartbeats go on."""

    rank: RankId | None = None
    clear: bool = False


class NanLoss(FaultSpec, tag="nan", kw_only=True):
    """The rank's next loss, as its trainer shim's numerics see it, is NaN: a diverging step
    (rolled back to the newest checkpoint before it)."""

    rank: RankId | None = None


class Sdc(FaultSpec, tag="sdc", kw_only=True):
    """Silent data corruption: after their next optimizer step, the node's ranks flip the top
    mantissa bit of element 0 of their first parameter (bit 22 in float32); that replica
    trains on, found at the next fingerprint and rolled back to a checkpoint known clean."""

    node: str | None = None


class LossSpike(FaultSpec, tag="loss-spike", kw_only=True):
    """A poisoned batch: the rank's next loss, as its trainer shim's numerics see it, is
    factor× (a loss spike, rolled back)."""

    rank: RankId | None = None
    factor: Annotated[float, msgspec.Meta(gt=1, le=1000)] = 10.0


class FillDisk(FaultSpec, tag="fill-disk", kw_only=True):
    """A ballast file in the node's checkpoint volume until less than free_mib MiB is free."""

    node: str | None = None
    free_mib: Annotated[float, msgspec.Meta(ge=0, le=1 << 30)] = 1.0
    clear: bool = False


class CorruptCheckpoint(FaultSpec, tag="corrupt-checkpoint", kw_only=True):
    """Flip one byte in a data file of the node's newest checkpoint (silent data corruption)."""

    node: str | None = None
    step: Annotated[int, msgspec.Meta(ge=0)] | None = None


class KillService(FaultSpec, tag="kill-service", kw_only=True):
    """SIGKILL a goodput service process of the stack (sensor, controller, actuator, …)."""

    service: str
    node: str = ""


class RestartNats(FaultSpec, tag="restart-nats", kw_only=True):
    """SIGKILL the embedded nats-server (a member of the embedded cluster) and start it again
    on the same ports and store."""

    down_s: NonNegative = 0.0
    #: which server of an embedded cluster (``goodput up --nats-cluster N``); 0 on its own
    member: Annotated[int, msgspec.Meta(ge=0)] = 0


FAULT_TYPES: tuple[type[FaultSpec], ...] = (
    KillRank,
    FailNode,
    GpuXid,
    HostFault,
    SlowRank,
    HangRank,
    NanLoss,
    Sdc,
    LossSpike,
    FillDisk,
    CorruptCheckpoint,
    KillService,
    RestartNats,
)
FAULTS_BY_KIND: dict[str, type[FaultSpec]] = {schemas.kind_of(t): t for t in FAULT_TYPES}
#: faults that can be undone (``clear``) and so take ``clear_after_s`` in a scenario
CLEARABLE: tuple[type[FaultSpec], ...] = (FailNode, GpuXid, HostFault, HangRank, FillDisk)


def describe(kind: str) -> str:
    """The one-line explanation of a fault kind (its struct's docstring)."""
    return (FAULTS_BY_KIND[kind].__doc__ or "").strip()
