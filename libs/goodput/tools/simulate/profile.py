"""Cost profiles and presets: TOML files checked whole, one error line naming the field.

A *cost profile* holds what every checkpoint and remediation costs (bandwidths, latencies,
delays); a *preset* is a job, a fleet, a failure model and the profile to price it with.
Both are msgspec structs: a missing field, an unknown one, a wrong type or a negative number
is refused with the path of the field (``$.checkpoint.object_write_gbps``). Only a field added
after profiles were shipped has a default (said at the field), so an older profile loads.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, TypeVar

import msgspec

NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Positive = Annotated[float, msgspec.Meta(gt=0)]
Count = Annotated[int, msgspec.Meta(ge=0)]
PositiveCount = Annotated[int, msgspec.Meta(ge=1)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]


class SimulateError(Exception):
    """Bad input to the simulator; the message is the one line the user sees."""


class Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class CheckpointCosts(Strict):
    #: device → host copy while training is blocked (asynchronous save's stall)
    snapshot_gbps: Positive
    #: host → the node's local volume
    local_write_gbps: Positive
    #: local volume → a peer node's volume (replication)
    peer_gbps: Positive
    #: a node's share → the object store, per node (also the synchronous save's stall)
    object_write_gbps: Positive
    #: restore bandwidths per tier
    local_read_gbps: Positive
    peer_read_gbps: Positive
    object_read_gbps: Positive
    #: fixed cost of any save or restore (metadata, manifest, barrier)
    latency_s: NonNegative
    #: multi-tier: every k-th checkpoint also goes to the object store
    object_every: PositiveCount
    #: an asynchronous save's fixed stall beside its copy: walking the state's tensors,
    #: planning the files, launching the copy (a state of hundreds of small tensors pays it
    #: more than its bytes). Added after profiles shipped, so 0 where a profile has none
    snapshot_latency_s: NonNegative = 0.0


class RestartCosts(Strict):
    #: stop the worker group (kill, wait for the processes to leave)
    stop_s: NonNegative
    #: start the rank processes and rendezvous
    launch_s: NonNegative
    #: after the restore: init, process groups, compile, until the first step completes
    startup_s: NonNegative
    #: a spare takes the failed node's place (scheduling, image, volume attach)
    hot_swap_provision_s: NonNegative
    #: reset a node's GPUs while its ranks are stopped (the ``gpu-reset`` rung)
    gpu_reset_s: NonNegative
    #: a warm restart (``RestartInProcess``): the surviving ranks unwind their step, answer
    #: ``Rejoin`` and form the new rendezvous with the replaced ranks (no process started)
    rejoin_s: NonNegative
    #: after a warm restart until the first step: process groups rebuilt, the model, optimizer
    #: and compiled state kept (a survivor) or built ahead of time (a ready standby)
    warm_startup_s: NonNegative
    #: a standby taken for a rank is replaced: its successor is ready after this long
    #: (an interpreter, torch and the job's state built: a cold rank's start-up)
    standby_ready_s: NonNegative
    #: the job's last step -> its ranks exited (the calculator's window ends there; a demo's
    #: 2 ranks: 1.7 s). Added after profiles shipped, so 0 where a profile has none
    shutdown_s: NonNegative = 0.0


class DetectionCosts(Strict):
    #: a rank's or host's event reaching the sensor (bus hop)
    event_latency_s: NonNegative
    #: signal → the controller's decision (bus hop, policy call)
    decision_s: NonNegative
    #: a GPU fault → the host monitor's report of it (its probe period)
    host_probe_s: NonNegative


class Pace(Strict):
    """The machine's pace while the profile was measured: the example job's median step time
    with a standby per node (``bench recovery``'s warm job, as the demo's goodput setup runs)
    and without one (its cold job, as the demo's baseline runs). A machine under load slows a
    step and everything else its CPUs do alike, so a run's median step over these says how
    much dearer that run's costs were than the profile's (:mod:`.pace`)."""

    warm_median_step_s: Positive
    cold_median_step_s: Positive


class CostProfile(Strict):
    name: str
    description: str
    checkpoint: CheckpointCosts
    restart: RestartCosts
    detection: DetectionCosts
    #: added after profiles shipped; None (a profile of another machine, or one calibrated
    #: before it): the costs are taken as they are, at whatever load a run meets
    pace: Pace | None = None


class JobSpec(Strict):
    gpus_per_node: PositiveCount
    nodes: PositiveCount
    num_nodes_per_dp: PositiveCount
    spares: Count
    hours: Positive
    step_time_s: Positive
    #: checkpoint state (model + optimizer) held per node, GB
    state_gb_per_node: Positive
    #: the fixed checkpoint interval the job is started with
    checkpoint_interval_s: Positive
    #: steps between the replicas' parameter fingerprints (the shim's ``fingerprint_every``)
    fingerprint_every_steps: PositiveCount = 100


class FailureModel(Strict):
    #: interrupting faults per day for the job's nodes (Poisson; a spare breaks at the same
    #: per-node rate)
    interruptions_per_day: NonNegative
    #: share of each kind among the interrupting faults (they are normalised)
    crash: NonNegative
    hang: NonNegative
    gpu_xid: NonNegative
    #: GPU faults a GPU reset clears (XID 48, uncorrected ECC)
    correctable: NonNegative
    lost_host: NonNegative
    #: stragglers per day (not interruptions: the job goes on, slower)
    stragglers_per_day: NonNegative
    straggler_factor: Annotated[float, msgspec.Meta(ge=1)]
    straggler_mean_s: Positive
    #: a failed node is repaired after a log-normal time with this median and shape
    repair_median_s: Positive
    repair_sigma: NonNegative
    #: share of silent data corruption in one replica's parameters (0: none; the llama3-16k
    #: preset states the published one)
    sdc: NonNegative = 0.0


class Preset(Strict):
    name: str
    description: str
    profile: str
    job: JobSpec
    failures: FailureModel


T = TypeVar("T", bound=msgspec.Struct)

PROFILE_DIR = "profiles"
PRESET_DIR = "presets"


def _shipped(folder: str) -> dict[str, Path]:
    root = resources.files("goodput.tools.simulate") / folder
    return {Path(p.name).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml")}


def shipped_profiles() -> list[str]:
    return sorted(_shipped(PROFILE_DIR))


def shipped_presets() -> list[str]:
    return sorted(_shipped(PRESET_DIR))


def _decode(path: Path, kind: type[T]) -> T:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SimulateError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SimulateError(f"{path}: not valid TOML: {exc}") from None
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise SimulateError(f"{path}: {exc}") from None


def _resolve(name_or_path: str, folder: str, what: str) -> Path:
    shipped = _shipped(folder)
    if name_or_path in shipped:
        return shipped[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        return path
    raise SimulateError(
        f"unknown {what} {name_or_path!r}; shipped: {', '.join(sorted(shipped))} (or a TOML file)"
    )


def load_profile(name_or_path: str) -> CostProfile:
    """A shipped profile by name, or a TOML file."""
    return _decode(_resolve(name_or_path, PROFILE_DIR, "cost profile"), CostProfile)


def load_preset(name_or_path: str) -> Preset:
    """A shipped preset by name, or a TOML file."""
    preset = _decode(_resolve(name_or_path, PRESET_DIR, "preset"), Preset)
    job = preset.job
    if job.nodes % job.num_nodes_per_dp:
        raise SimulateError(
            f"preset {preset.name}: $.job.nodes ({job.nodes}) is not a multiple of "
            f"$.job.num_nodes_per_dp ({job.num_nodes_per_dp})"
        )
    return preset
