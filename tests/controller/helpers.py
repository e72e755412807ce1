"""Shared builders for controller tests."""

from __future__ import annotations

from goodput import schemas
from goodput.policy.state import JobState, new_job_state

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


def signal(kind: str, node: str = "", severity: str = "correctable", **fields) -> schemas.Signal:
    return schemas.Signal(
        job=JOB, signal=kind, node=node, severity=severity, detail="test", **fields
    )
