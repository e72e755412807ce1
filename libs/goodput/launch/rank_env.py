"""The environment of a rank process: the one contract between the actuator, which writes it,
and the shim, the checkpointer and training scripts, which read it.

torchrun's variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``…) plus goodput's own
(``GOODPUT_JOB``, ``GOODPUT_NODE``, ``GOODPUT_ATTEMPT``…), each spelled once, in
:data:`VARIABLES`. The knobs a user may set for a job (``GOODPUT_CKPT_EVERY`` and the like,
``None`` when unset) are written only when set, so the reader's own default applies otherwise.
The bus a rank reaches (``GOODPUT_NATS_*``) is not here: :mod:`goodput.bus.settings` reads
and writes it, for services and ranks alike. torch's NCCL error handling a rank needs to outlive
a peer's death is (:data:`NCCL_ERROR_HANDLING`): the actuator writes it under the job's own
``StartJob.env``, :func:`goodput.shim.run_job` sets it where it creates an NCCL group.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from goodput import schemas
from goodput.subjects import DEFAULT_JOB
from goodput.telemetry import TRACEPARENT_ENV

#: a rank that saved and left on SIGTERM (the node is going away) exits 128 + 15
EXIT_TERMINATED = 143
#: the exit codes of a rank whose CUDA context cannot go on (``goodput.shim.step_faults``),
#: the one channel every backend already reports (``RankExited.exit_code``), whether or not
#: the rank's bus link still works: outside Python's own (1, 2, 120), sysexits' (64-78) and
#: the shell's (126 and above)
EXIT_CODES: dict[schemas.RankFault, int] = {"cuda-context": 86, "cuda-oom": 87}


def rank_fault(exit_code: int | None) -> schemas.RankFault:
    """The CUDA cause an exit code says (``""``: none)."""
    return next((fault for fault, code in EXIT_CODES.items() if code == exit_code), "")


#: field -> environment variable
VARIABLES: dict[str, str] = {
    "rank": "RANK",
    "local_rank": "LOCAL_RANK",
    "group_rank": "GROUP_RANK",
    "world_size": "WORLD_SIZE",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
    "restart_count": "TORCHELASTIC_RESTART_COUNT",
    "job": "GOODPUT_JOB",
    "node": "GOODPUT_NODE",
    "attempt": "GOODPUT_ATTEMPT",
    "num_dp_replicas": "GOODPUT_NUM_DP_REPLICAS",
    "num_nodes_per_dp": "GOODPUT_NUM_NODES_PER_DP",
    "traceparent": TRACEPARENT_ENV,
    "ckpt_dir": "GOODPUT_CKPT_DIR",
    "ckpt_every": "GOODPUT_CKPT_EVERY",
    "ckpt_mode": "GOODPUT_CKPT_MODE",
    "heartbeat_period_s": "GOODPUT_HEARTBEAT_PERIOD_S",
    "enable_fault_injection": "GOODPUT_ENABLE_FAULT_INJECTION",
    "standby": "GOODPUT_STANDBY",
    "device": "GOODPUT_DEVICE",
    "restore_before_step": "GOODPUT_RESTORE_BEFORE_STEP",
    "numerics_every": "GOODPUT_NUMERICS_EVERY",
    "fingerprint_every": "GOODPUT_FINGERPRINT_EVERY",
    "skip_steps": "GOODPUT_SKIP_STEPS",
    "launched_ns": "GOODPUT_LAUNCHED_NS",
}

#: torch's NCCL error handling for a rank that must outlive a peer's death (the names of torch
#: 2.13, read when a group is created). A dead peer leaves an NCCL collective spinning; the
#: in-process restart aborts the communicators (``_abort_process_group``,
#: :mod:`goodput.shim.group_abort`) and the rank unwinds. torch 2.13 documents that call for
#: use with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` (``distributed_c10d._abort_process_group``):
#: otherwise the group's watchdog handles errors and timeouts itself, aborting the same
#: communicators — with 2 ("CleanUpOnly") it could do so while goodput's abort runs, two
#: ``ncclCommAbort`` on one communicator; with torch's default 3 ("SkipCleanUp") it kills the
#: rank (SIGABRT), so every survivor would die with its peer. With 0 goodput's abort is the
#: only one: a collective on a dead or hung peer stays blocked until the ``Rejoin`` aborts it
#: (the sensor sees the peer's exit or the hang), and a rank whose supervisor never sends one
#: waits for it. Left at torch's default:
#: ``TORCH_NCCL_BLOCKING_WAIT`` (a blocking ``wait()`` busy-waits the CPU on every collective,
#: serialising DDP's overlapped reductions; goodput ends a hang by aborting instead),
#: ``TORCH_NCCL_ENABLE_MONITORING`` with ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (kills a rank
#: whose watchdog itself is stuck, minutes later: the backstop behind the bounded abort) and
#: ``TORCH_NCCL_DUMP_ON_TIMEOUT`` (the flight recorder's dump on a timeout).
NCCL_ERROR_HANDLING: dict[str, str] = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}

_TRUE = ("1", "true", "yes")
_FLAGS = ("enable_fault_injection", "standby")


class RankEnvError(ValueError):
    """A variable of the rank environment does not parse; the message names it."""


#: ``GOODPUT_SKIP_STEPS``: ``first-last`` step windows separated by commas
STEP_WINDOWS_PATTERN = r"^[0-9]+-[0-9]+(,[0-9]+-[0-9]+)*$"


def format_step_windows(windows: tuple[schemas.StepWindow, ...]) -> str:
    """Windows as ``GOODPUT_SKIP_STEPS`` spells them ("" for none)."""
    return ",".join(f"{w.first}-{w.last}" for w in windows)


def skipped(step: int, windows: Iterable[schemas.StepWindow]) -> bool:
    """Whether the batch of ``step`` is skipped: it lies in one of ``windows``."""
    return any(step in window for window in windows)


def parse_step_windows(text: str) -> tuple[schemas.StepWindow, ...]:
    """The windows ``text`` spells (:func:`format_step_windows`); a malformed one raises
    :class:`RankEnvError` naming the variable."""
    if not text:
        return ()
    try:
        return tuple(
            msgspec.convert(item.split("-"), schemas.StepWindow, strict=False)
            for item in text.split(",")
        )
    except msgspec.ValidationError as exc:
        raise RankEnvError(f"{VARIABLES['skip_steps']}={text!r}: {exc}") from None


class RankEnv(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # torchrun's
    rank: int = 0
    local_rank: int = 0
    #: the node's index among the active nodes
    group_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str = ""
    master_port: int = 0
    restart_count: int = 0
    # goodput's
    job: str = DEFAULT_JOB
    node: str = "local"
    #: the actuator's launch number of the worker group, from 1
    attempt: int = 1
    num_dp_replicas: int = 1
    num_nodes_per_dp: int = 1
    #: W3C traceparent of the launch span: the rank's restore and first step continue it
    traceparent: str = ""
    #: when the actuator launched this rank (epoch ns): the trainer's commands are read from
    #: then, so one sent while the rank starts up (the interval the controller sends again
    #: after a relaunch) is not missed; None: from when the rank's bus link starts
    launched_ns: schemas.EpochNs | None = None
    # the job's knobs (StartJob.env); None: unset, the reader's default applies
    ckpt_dir: str | None = None
    ckpt_every: int | None = None
    ckpt_mode: Literal["async", "torch-save"] | None = None
    heartbeat_period_s: float | None = None
    enable_fault_injection: bool | None = None
    #: this process is a standby: it builds the job's state, then waits for an assignment (a
    #: RankEnv, :mod:`goodput.launch.standby_channel`) before it is a rank; None/False: a rank
    standby: bool | None = None
    #: the CUDA device this rank binds, where its launcher chooses (the local backend: its
    #: nodes share one machine, so a local rank alone does not name a GPU of its own); None:
    #: its local rank (``goodput.launch.capacity.rank_device``)
    device: int | None = None
    #: a numerical rollback's launch: restore the newest checkpoint before this step
    restore_before_step: int | None = None
    #: steps per numerics window, and between the replicas' parameter fingerprints (a
    #: multiple of it): ``goodput.shim.numerics``
    numerics_every: Annotated[int, msgspec.Meta(ge=1)] | None = None
    fingerprint_every: Annotated[int, msgspec.Meta(ge=1)] | None = None
    #: steps whose batches the rank trains on none of (a loss spike's windows, kept by the
    #: actuator from the rollback on): ``first-last`` items separated by commas
    skip_steps: Annotated[str, msgspec.Meta(pattern=STEP_WINDOWS_PATTERN)] | None = None

    def skipped_windows(self) -> tuple[schemas.StepWindow, ...]:
        """:attr:`skip_steps` as windows (none when unset)."""
        return parse_step_windows(self.skip_steps or "")

    def to_env(self) -> dict[str, str]:
        """The variables to put in a rank's environment (unset knobs left out)."""
        env: dict[str, str] = {}
        for field, variable in VARIABLES.items():
            value = getattr(self, field)
            if value is None:
                continue
            env[variable] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankEnv:
        """The rank environment in ``env`` (default: this process's); missing variables take
        the defaults, a malformed one raises :class:`RankEnvError` naming it."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field, variable in VARIABLES.items():
            raw = env.get(variable)
            if raw is None or (raw == "" and field not in ("master_addr", "traceparent")):
                continue
            values[field] = raw.strip().lower() in _TRUE if field in _FLAGS else raw
            try:
                msgspec.convert({field: values[field]}, cls, strict=False)
            except msgspec.ValidationError as exc:
                raise RankEnvError(f"{variable}={raw!r}: {str(exc).split(' - at ')[0]}") from None
        rank_env = msgspec.convert(values, cls, strict=False)
        rank_env.skipped_windows()  # each window checked here, before training
        return rank_env


def nccl_error_handling(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of :data:`NCCL_ERROR_HANDLING` that ``env`` leaves unset: a value the user
    chose (``StartJob.env``, their launcher's environment) wins."""
    return {name: value for name, value in NCCL_ERROR_HANDLING.items() if name not in env}


#: the directory whose ``sitecustomize`` hooks a launched process's uncaught exceptions, so
#: that a CUDA fault outside the shim's loop still exits 86/87 (``goodput.shim.exit_hook``);
#: a path of this installation: only a launcher on the ranks' own machine (the local backend,
#: a node agent) can name it, and the rank image puts it on its PYTHONPATH itself
RANK_BOOT_DIR = Path(__file__).resolve().parents[1] / "shim" / "rank_boot"


def with_rank_boot(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`RANK_BOOT_DIR` first on ``PYTHONPATH`` (kept once, the job's own
    entries after it)."""
    boot = str(RANK_BOOT_DIR)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    return {**env, "PYTHONPATH": os.pathsep.join([boot, *rest])}


def knobs(**values: Any) -> dict[str, str]:
    """Variables for ``StartJob.env`` (``knobs(ckpt_every=20)``), only those given; an unknown
    name or a wrong type raises :class:`RankEnvError`."""
    try:
        env = msgspec.convert(values, RankEnv).to_env()
    except msgspec.ValidationError as exc:
        raise RankEnvError(str(exc)) from None
    return {VARIABLES[f]: env[VARIABLES[f]] for f in values if VARIABLES[f] in env}
