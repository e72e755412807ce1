"""The Kubernetes backend when things fail, against the API FAKE of ``kubernetes_fake``: refused
calls, unknown or missing nodes, pods lost while the watch was down or left by a dead
actuator, a node whose pods are still terminating."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import replace

import msgspec
import pytest
from kubernetes import client

from goodput import schemas
from goodput.supervisor.membership import MembershipError
from goodput_services.actuator import kubernetes_watch
from goodput_services.actuator.kubernetes_backend import IMMEDIATE_GRACE_S, KubernetesBackend
from goodput_services.actuator.kubernetes_pods import run_tag
from goodput_services.actuator.kubernetes_ranks import FORCE_GRACE_S
from tests.actuator.kubernetes_fake import (
    JOB,
    RUN,
    Recorder,
    _backend,
    _placement,
    _start,
)


async def test_a_refused_force_deletion_fails_the_command_and_is_tried_again_later(rig) -> None:
    backend, api, recorder = rig
    await backend.start_job(_start())
    api.refuse_delete = {f"job-k8s-{RUN}-a1-r0"}
    with pytest.raises(RuntimeError, match=f"cannot delete pod job-k8s-{RUN}-a1-r0: 403 Forbidden"):
        await backend.hot_swap("gpu-a", "", "XID 79")
    # the deletions that were allowed happened, and only their exits are reported
    assert sorted(name for name, _ in api.deleted) == [f"job-k8s-{RUN}-a1-r{r}" for r in (1, 2, 3)]
    lost = [e for e in recorder.of(schemas.RankExited) if e.node == "gpu-a"]
    assert [(e.rank, e.signal) for e in lost] == [(1, signal.SIGKILL)]

    api.refuse_delete.clear()
    await backend.restart("retry")
    assert (f"job-k8s-{RUN}-a1-r0", FORCE_GRACE_S) in api.deleted
    lost = [e for e in recorder.of(schemas.RankExited) if e.node == "gpu-a"]
    assert sorted((e.rank, e.signal, e.expected_reason) for e in lost) == [
        (0, signal.SIGKILL, "hot_swap"),
        (1, signal.SIGKILL, "hot_swap"),
    ]
    assert _placement(api, 2) == [(0, "gpu-c"), (1, "gpu-c"), (2, "gpu-b"), (3, "gpu-b")]


async def test_commands_naming_unknown_nodes_are_rejected_without_touching_pods(rig) -> None:
    backend, api, _ = rig
    await backend.start_job(_start(spares=0))
    for command in (
        backend.hot_swap("gpu-z", "", "?"),
        backend.hot_swap("gpu-a", "", "no spare"),
        backend.hot_swap("gpu-a", "cpu-a", "not a spare"),
        backend.scale_to(["ghost"], [], "?"),
        backend.return_node("ghost"),
    ):
        with pytest.raises(MembershipError):
            await command
    assert api.deleted == [] and len(api.created) == 4
    assert backend.state == "running" and backend.attempt == 1


async def test_a_pod_that_vanished_while_the_watch_was_down_is_reported(rig, monkeypatch) -> None:
    backend, api, recorder = rig
    monkeypatch.setattr(kubernetes_watch, "WATCH_RETRY_S", 0.01)
    await backend.start_job(_start(nodes=1, spares=0))
    await asyncio.sleep(0)
    del api.pods[f"job-k8s-{RUN}-a1-r1"]  # node lost: the pod is gone, no event was delivered
    api.events.put({"type": "BROKEN"})
    lost = await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited))
    assert (lost.rank, lost.exit_code, lost.signal, lost.expected_reason) == (1, None, None, "")


async def test_too_few_matching_nodes_is_an_error_and_creates_nothing(rig) -> None:
    backend, api, _ = rig
    with pytest.raises(RuntimeError, match="needs 4 nodes; 3 ready nodes match"):
        await backend.start_job(_start(nodes=4))
    assert api.created == [] and backend.state == "stopped"


async def test_a_refused_pod_creation_fails_the_attempt_and_cleans_up(rig) -> None:
    backend, api, recorder = rig
    api.refuse_create_after = 2
    with pytest.raises(RuntimeError, match="403"):
        await backend.start_job(_start())
    assert api.pods == {}
    assert sorted(name for name, _ in api.deleted) == [p.metadata.name for p in api.created]
    assert recorder.of(schemas.JobStatus)[-1].state == "failed"


async def test_pods_left_by_an_earlier_actuator_are_deleted_before_starting(rig) -> None:
    backend, api, recorder = rig
    stale = client.V1Pod(  # named as before pod names carried the run
        metadata=client.V1ObjectMeta(
            name="job-k8s-a1-r0",
            labels={
                "goodput.dev/job": JOB,
                "goodput.dev/attempt": "1",
                "goodput.dev/rank": "0",
                "goodput.dev/node": "gpu-a",
            },
        ),
        status=client.V1PodStatus(phase="Running"),
    )
    api.pods[stale.metadata.name] = stale
    await backend.start_job(_start())
    assert api.deleted[0] == ("job-k8s-a1-r0", IMMEDIATE_GRACE_S)
    assert len(api.created) == 4
    # its exit is the earlier run's, not this one's
    await recorder.wait_for(lambda e: isinstance(e, schemas.JobStatus))
    assert not recorder.of(schemas.RankExited)


def _kill_actuator(backend: KubernetesBackend) -> None:
    """The actuator process dies: its watch ends, its pods stay (nothing deletes them)."""
    backend._watcher.stop()
    assert backend._consumer is not None
    backend._consumer.cancel()


async def test_a_restarted_actuator_starts_the_job_beside_a_dead_nodes_pods(rig) -> None:
    """Issue 28: a node dies, the actuator dies, a new actuator starts the same job."""
    first, api, _ = rig
    await first.start_job(_start(nodes=2, spares=1))  # gpu-a, gpu-b; gpu-c spare
    api.kill_node("gpu-b")
    _kill_actuator(first)
    first.ranks = []  # what the dead actuator held is gone with it; its pods are not

    recorder = Recorder()
    second = _backend(api, recorder)
    try:
        started = time.monotonic()
        rerun = msgspec.structs.replace(_start(nodes=2, spares=0), run_id="run-2")
        await second.start_job(rerun)
        assert time.monotonic() - started < 5  # no 31 s wait for gpu-b's pods
        assert api.conflicts == []  # no 409
        # gpu-b is not Ready: its pods were force-deleted, the others' given their grace
        graces = dict(api.deleted)
        assert {graces[f"job-k8s-{RUN}-a1-r{r}"] for r in (2, 3)} == {FORCE_GRACE_S}
        assert {graces[f"job-k8s-{RUN}-a1-r{r}"] for r in (0, 1)} == {IMMEDIATE_GRACE_S}
        assert second.membership.active == ["gpu-a", "gpu-c"]
        new = run_tag("run-2")
        assert sorted(api.pods) == [f"job-k8s-{new}-a1-r{r}" for r in range(4)]
        # the new run's history: its own run and attempts; nothing of the earlier run's pods
        (begun,) = recorder.of(schemas.RunStarted)
        assert begun.run_id == "run-2"
        assert not recorder.of(schemas.RankExited)
        status = recorder.of(schemas.JobStatus)[-1]
        assert (status.run_id, status.attempt, status.state) == ("run-2", 1, "running")
    finally:
        await second.shutdown()


async def test_a_reset_is_not_asked_while_a_rank_pod_of_the_node_is_terminating(rig) -> None:
    backend, api, recorder = rig
    backend.pods.margin_s = 0.2
    asked: list[str] = []

    async def resetter(node: str, gpus: list[int], run_id: str, attempt: int):
        asked.append(node)
        return True, "reset"

    backend.ports = replace(backend.ports, reset_gpus=resetter)
    await backend.start_job(_start(nodes=2, spares=0))
    api.kill_node("gpu-b")  # nobody has declared it failed: its pods stay Terminating
    with pytest.raises(RuntimeError, match="GPU reset not asked") as refused:
        await backend.restart("XID 79", reset_gpus={"gpu-b": []})
    assert asked == []
    for rank in (2, 3):
        assert f"job-k8s-{RUN}-a1-r{rank} (Terminating)" in str(refused.value)
    status = recorder.of(schemas.JobStatus)[-1]
    assert "gpu-b still has pod" in status.detail and "Terminating" in status.detail
    lost = [e for e in recorder.of(schemas.RankExited) if e.node == "gpu-b"]
    assert sorted((e.rank, e.exit_code, e.signal) for e in lost) == [
        (2, None, None),
        (3, None, None),
    ]
    # and no pod is placed on the suspect node until it is replaced
    with pytest.raises(RuntimeError, match="no pod placed: gpu-b never confirmed"):
        await backend.restart("again")
    assert not [p for p in api.created if p.metadata.labels["goodput.dev/attempt"] == "2"]


async def test_a_refused_service_deletion_fails_the_stop_in_one_line(rig) -> None:
    backend, api, _ = rig
    await backend.start_job(_start())

    api.refuse_delete.add("job-k8s-ranks")
    with pytest.raises(RuntimeError) as refused:
        await backend.stop("done")
    assert str(refused.value) == "cannot delete service job-k8s-ranks: 403 Forbidden"
    assert api.pods == {}  # the ranks were stopped first
