"""What each rank and standby of a run is told: torchrun's variables, the shim's, the bus's
and the checkpoint key's.

One place for every backend (local processes, node agents, pods): a rank's own variables
(:class:`~goodput.launch.rank_env.RankEnv`, also what a standby's assignment carries), the job's
environment, the bus the shim reaches, and the NCCL error handling an in-process restart needs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from goodput import schemas
from goodput.bus import BusSettings
from goodput.bus.settings import settings_to_env
from goodput.checkpoint.format.job_key import key_env, key_file_from_env
from goodput.launch.rank_env import (
    VARIABLES,
    RankEnv,
    format_step_windows,
    nccl_error_handling,
)
from goodput.supervisor.membership import Membership
from goodput.telemetry import current_traceparent
from goodput_services.actuator.skip_history import with_window


class RankEnvironments:
    """Mixed into :class:`~goodput_services.actuator.backend.MembershipBackend`, whose
    attributes below it reads."""

    job: str
    bus_settings: BusSettings
    spec: schemas.StartJob | None
    membership: Membership | None
    attempt: int
    #: (attempt, step): that attempt's ranks restore the newest checkpoint before the step
    _rollback: tuple[int, int] | None = None
    #: the windows whose batches every rank of the run skips, oldest first: read back from
    #: the run's commands at its start (``skip_history``), then one more per spike's restart
    _skips: tuple[schemas.StepWindow, ...] = ()

    def roll_back_before(self, step: int | None) -> None:
        """The next attempt's ranks (only those: a later relaunch resumes from the newest
        checkpoint again) restore before ``step`` (None: the newest, as usual)."""
        self._rollback = None if step is None else (self.attempt + 1, step)

    def rollback_bound(self) -> int | None:
        """The step this attempt's ranks restore before (a numerical rollback's), else None."""
        rollback = self._rollback
        return rollback[1] if rollback is not None and rollback[0] == self.attempt else None

    def skip_data(self, window: schemas.StepWindow) -> None:
        """Every later attempt's ranks skip the batches of ``window`` too: a relaunch from a
        checkpoint before it would otherwise train on the poisoned batch again."""
        self._skips = with_window(self._skips, window)

    def begin_skips(self, windows: tuple[schemas.StepWindow, ...]) -> None:
        """A run (re)starts: its ranks skip ``windows`` (those of its earlier restarts), and
        no rollback bound of another run's attempt is left over."""
        self._skips, self._rollback = windows, None

    def rank_bus_environment(self) -> dict[str, str]:
        """The ``GOODPUT_NATS_*`` variables with which the shim reaches the bus like the
        actuator, and the job's checkpoint key the actuator was given (``GOODPUT_CKPT_KEY_FILE``:
        the rank signs and checks its manifests with it).

        A backend whose ranks see files elsewhere (pods) translates the paths.
        """
        key_file = key_file_from_env()
        return {**settings_to_env(self.bus_settings), **(key_env(key_file) if key_file else {})}

    def standby_environment(self) -> dict[str, str]:
        """What a standby of the run is started with: a rank's environment but the rank's own
        variables, which its assignment brings (``goodput.supervisor.standby_pool``)."""
        assert self.spec is not None
        return {
            **self.spec.env,
            **self.rank_bus_environment(),
            VARIABLES["job"]: self.job,
            "PYTHONUNBUFFERED": "1",
        }

    def rank_environment(self, **where: Any) -> dict[str, str]:
        """What a rank is told, as torchrun would tell it, plus what the trainer shim reads
        (``where``: the arguments of :meth:`rank_env`) and the NCCL error handling an
        in-process restart needs, unless the job's own env sets it."""
        assert self.spec is not None
        return {
            **nccl_error_handling(self.spec.env),
            **self.spec.env,
            **self.rank_env(**where).to_env(),
            **self.rank_bus_environment(),
            "PYTHONUNBUFFERED": "1",
        }

    def rank_env(
        self,
        *,
        node: str,
        node_index: int,
        rank: int,
        local_rank: int,
        master_addr: str,
        master_port: int,
        volume: Path,
        device: int | None = None,
    ) -> RankEnv:
        """A rank's own variables: what a standby's assignment carries."""
        assert self.spec is not None and self.membership is not None
        membership = self.membership
        nodes_per_dp = max(self.spec.num_nodes_per_dp, 1)
        return RankEnv(
            rank=rank,
            local_rank=local_rank,
            group_rank=node_index,
            world_size=membership.world_size,
            local_world_size=membership.procs_per_node,
            master_addr=master_addr,
            master_port=master_port,
            restart_count=self.attempt - 1,
            job=self.job,
            node=node,
            attempt=self.attempt,
            num_dp_replicas=len(membership.active) // nodes_per_dp,
            num_nodes_per_dp=nodes_per_dp,
            # the launch's trace context: the shim's restore and first step continue it
            traceparent=current_traceparent(),
            launched_ns=time.time_ns(),
            # the job's own checkpoint directory (a shared one) wins over the node's volume
            ckpt_dir=self.spec.env.get(VARIABLES["ckpt_dir"]) or str(volume),
            device=device,
            restore_before_step=self.rollback_bound(),
            skip_steps=format_step_windows(self._skips) or None,
        )
