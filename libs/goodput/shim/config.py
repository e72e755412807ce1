"""What a rank's shim is configured with: the job, its place in it, the bus, the checkpoint
knobs — read from the environment the actuator wrote (:class:`~goodput.launch.rank_env.RankEnv`)."""

from __future__ import annotations

import os
from typing import Any, Literal

import msgspec

from goodput import schemas
from goodput.bus import BusSettings
from goodput.bus.settings import settings_from_env
from goodput.checkpoint.engine.device_copy import restore_pinned_bytes
from goodput.checkpoint.engine.parts_commit import PartLayout
from goodput.checkpoint.index.retention import DEFAULT_KEEP
from goodput.launch.rank_env import VARIABLES, RankEnv, RankEnvError
from goodput.schemas.tiers import LOCAL
from goodput.subjects import DEFAULT_JOB


class ShimConfig(msgspec.Struct, kw_only=True):
    job: str = DEFAULT_JOB
    node: str = "local"
    rank: int = 0
    world_size: int = 1
    #: ranks of this node share its local volume: they split the (identical) state among them
    local_rank: int = 0
    local_world_size: int = 1
    #: nodes one model replica spans; ranks per model replica (1: every rank is a
    #: data-parallel replica, as with DDP): together they give the data-parallel size
    num_nodes_per_dp: int = 1
    model_parallel_size: int = 1
    attempt: int = 1
    #: the bus, from ``GOODPUT_NATS_*`` as the actuator set them (URL, credentials, TLS);
    #: None (no ``GOODPUT_NATS_URL``): no supervision, the script trains on its own
    bus: BusSettings | None = None
    ckpt_dir: str = "checkpoints"
    #: steps between checkpoints; the controller may change it (SetCheckpointInterval)
    ckpt_every: int = 50
    #: complete checkpoints the node's volume keeps where no replicator serves it (one that
    #: does publishes its own ``keep_local``, and the engine keeps as many)
    keep_last: int = DEFAULT_KEEP[LOCAL]
    #: "async": goodput's checkpoint engine; "torch-save": the synchronous baseline
    #: (rank 0 writes into a ``ckpt_dir`` every node shares), for comparisons
    ckpt_mode: Literal["async", "torch-save"] = "async"
    heartbeat_period_s: float = 0.5
    #: steps per numerics window (loss and gradient norm read from the device once a window)
    numerics_every: int = 10
    #: steps between parameter fingerprints of the replicas (a multiple of numerics_every)
    fingerprint_every: int = 100
    #: a numerical rollback's launch: restore the newest checkpoint before this step
    restore_before_step: int | None = None
    #: when the actuator launched this rank: its commands are read from then (None: now)
    launched_ns: int | None = None
    #: steps whose batches this rank trains on none of (a loss spike's rollback)
    skip_steps: tuple[schemas.StepWindow, ...] = ()
    #: obey InjectFault commands (chaos testing: ``goodput.shim.injected_faults``)
    enable_fault_injection: bool = False

    @classmethod
    def from_env(cls, **overrides: Any) -> ShimConfig:
        """What the actuator put in the environment (:class:`~goodput.launch.rank_env.RankEnv`, the
        bus from ``GOODPUT_NATS_*``); a malformed variable raises ``RankEnvError``."""
        env = os.environ
        rank_env = RankEnv.from_env(env)
        try:
            restore_pinned_bytes(env)  # read at each restore: refused here, before training
        except ValueError as exc:
            raise RankEnvError(str(exc)) from None
        if rank_env.standby:
            # a standby has no rank yet: trained on, it would be a second "rank 0" of its own
            raise RankEnvError(
                f"{VARIABLES['standby']}=1: this process is a standby rank; serve it with "
                "goodput.shim.run_job(build_state, steps), which waits for its assignment"
            )
        values: dict[str, Any] = {
            "job": rank_env.job,
            "node": rank_env.node,
            "rank": rank_env.rank,
            "world_size": rank_env.world_size,
            "local_rank": rank_env.local_rank,
            "local_world_size": rank_env.local_world_size,
            "num_nodes_per_dp": rank_env.num_nodes_per_dp,
            "attempt": rank_env.attempt,
            "bus": settings_from_env(env) if env.get("GOODPUT_NATS_URL") else None,
            "ckpt_dir": rank_env.ckpt_dir,
            "ckpt_every": rank_env.ckpt_every,
            "ckpt_mode": rank_env.ckpt_mode,
            "heartbeat_period_s": rank_env.heartbeat_period_s,
            "enable_fault_injection": rank_env.enable_fault_injection,
            "restore_before_step": rank_env.restore_before_step,
            "numerics_every": rank_env.numerics_every,
            "fingerprint_every": rank_env.fingerprint_every,
            "skip_steps": rank_env.skipped_windows(),
            "launched_ns": rank_env.launched_ns,
        }
        values.update(overrides)
        # unset knobs take this struct's defaults
        config = msgspec.convert({k: v for k, v in values.items() if v is not None}, cls)
        if config.fingerprint_every % config.numerics_every:
            raise RankEnvError(
                f"{VARIABLES['fingerprint_every']}={config.fingerprint_every} is not a multiple "
                f"of {VARIABLES['numerics_every']}={config.numerics_every}: a fingerprint rides "
                "on a numerics window's end"
            )
        return config


def node_parts(config: ShimConfig) -> PartLayout | None:
    """The node's part of a sharded state, when the job's ranks span several nodes (ranks
    numbered node by node, as torchrun and goodput's launchers do); None on one node (its
    root holds every shard) or ranks numbered otherwise (a spanning sharded save then fails
    with the reason)."""
    nodes, spare = divmod(config.world_size, config.local_world_size)
    if nodes <= 1 or spare or config.rank % config.local_world_size != config.local_rank:
        return None
    return PartLayout(
        part=config.rank // config.local_world_size,
        parts=nodes,
        rank=config.rank,
        world=config.world_size,
        local_rank=config.local_rank,
        local_world=config.local_world_size,
        namespace=f"{config.job}/attempt-{config.attempt}",
    )
