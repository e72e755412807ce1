"""Shared builders for controller tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from goodput import schemas
from goodput.bus import EmbeddedNats
from goodput.supervisor.jobstate.folds import new_job_state, observe_status
from goodput.supervisor.jobstate.model import JobState

JOB = "job"
NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def at(seconds: float) -> int:
    return T0 + int(seconds * NS)


def job(active: int = 6, spares: int = 0, per_dp: int = 2) -> JobState:
    return new_job_state(
        JOB,
        [f"n{i}" for i in range(active)],
        spares=[f"s{i}" for i in range(spares)],
        num_nodes_per_dp=per_dp,
        procs_per_node=8,
        now=T0,
    )


def status_of(of: JobState, /, **fields) -> schemas.JobStatus:
    """A JobStatus of attempt 1 running the membership of ``of``, ``fields`` over it."""
    membership = dict(
        job=JOB,
        state="running",
        attempt=1,
        world_size=of.world_size,
        procs_per_node=of.procs_per_node,
        active_nodes=of.active,
        spare_nodes=of.spares,
    )
    return schemas.JobStatus(**{**membership, **fields})


def with_standbys(state: JobState, nodes: list[str], **fields) -> JobState:
    """``state`` once a JobStatus of it reported a ready standby on each of ``nodes`` (and
    ``fields``, such as the backend's capabilities)."""
    standbys = {node: [1000 + i] for i, node in enumerate(nodes)}
    return observe_status(state, status_of(state, standbys=standbys, **fields), at(0.5))


def signal(kind: str, node: str = "", severity: str = "correctable", **fields) -> schemas.Signal:
    return schemas.Signal(
        job=JOB, signal=kind, node=node, severity=severity, detail="test", **fields
    )


def spawn_service(
    name: str, job: str, server: EmbeddedNats, state: Path, *options: str
) -> subprocess.Popen:
    """A real service process of ``job`` on ``server``; ``options`` as ``--set`` flags; its
    instance name and log file tell apart several processes of one service."""
    flags = [item for option in options for item in ("--set", option)]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            f"goodput_services.{name}",
            "--job",
            job,
            "--nats-url",
            server.url,
            "--state-dir",
            str(state),
            "--instance",
            f"{name}-{len(options)}",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(state / f"{name}-{os.getpid()}-{len(options)}.log", "ab"),
    )
