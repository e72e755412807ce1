"""Rank faults against real rank processes: kill, fail a node, slow down, hang."""

from __future__ import annotations

import asyncio
import json
import signal

import msgspec
import psutil
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.state_dir import StateDir
from goodput.tools.chaos import fire
from goodput.tools.chaos import spec as faults
from goodput.tools.chaos.straggler import stop_detached
from tests.chaos.conftest import VictimJob
from tests.chaos.processes import (
    HealthTap,
    process_state,
    put_job_status,
    start_hostmon,
    start_rank,
)


async def _trainer_commands(victim_job: VictimJob, count: int) -> list[schemas.Command]:
    """The first ``count`` commands sent to the job's trainers, from the stream's start."""
    subscription = await victim_job.bus.js.pull_subscribe(
        subjects.command(victim_job.job, subjects.TRAINER),
        stream=subjects.COMMANDS_STREAM,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    return [schemas.decode_command(m.data) for m in await subscription.fetch(count, timeout=5)]


async def test_kill_rank_from_the_cli(victim_job: VictimJob):
    result = await victim_job.cli("kill-rank", "--rank", "1", "--json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["ok"] and outcome["fault"] == "kill-rank"
    assert f"pid {victim_job.ranks[1].pid}" in outcome["target"]
    assert victim_job.ranks[1].wait(10) == -signal.SIGKILL
    assert all(victim_job.ranks[r].poll() is None for r in (0, 2, 3))


async def test_a_rank_that_is_not_running_is_an_error(victim_job: VictimJob):
    outcome = await fire(faults.KillRank(rank=9), victim_job.context())
    assert (
        not outcome.ok and "rank 9" in outcome.detail and "live ranks: 0, 1, 2, 3" in outcome.detail
    )


async def test_a_recycled_pid_is_never_signalled(victim_job: VictimJob):
    # the job status names a pid that now belongs to a process of another job
    stranger = start_rank("another-job", "node-0", 0)
    victim_job.extra.append(stranger)
    await put_job_status(victim_job.bus, victim_job.job, {"node-0": [stranger.pid]})
    outcome = await fire(faults.KillRank(rank=0), victim_job.context())
    assert not outcome.ok and "no live rank" in outcome.detail
    assert stranger.poll() is None


async def test_random_rank_is_chosen_by_the_seed(victim_job: VictimJob):
    picks = []
    for _ in range(2):
        ctx = victim_job.context(seed=42)
        picks.append((await ctx.rank(None)).rank)
        await ctx.close()
    assert picks[0] == picks[1]


async def test_fail_node_kills_its_ranks_and_the_host_monitor_reports_node_down(
    victim_job: VictimJob,
):
    health = await HealthTap(victim_job.bus, victim_job.job).start()
    hostmon = start_hostmon(
        victim_job.url,
        victim_job.state_dir,
        victim_job.job,
        "node-1",
        "enable_fault_injection=true",
        "health_interval_s=600",
    )
    victim_job.extra.append(hostmon)
    await health.wait_for(lambda r: r.node == "node-1" and r.ranks_alive == 2)

    result = await victim_job.cli("fail-node", "--node", "node-1")
    assert result.returncode == 0, result.stderr
    assert (
        "rank 2" in result.stdout
        and "rank 3" in result.stdout
        and "injected node_down" in result.stdout
    )
    assert victim_job.ranks[2].wait(10) == -signal.SIGKILL
    assert victim_job.ranks[3].wait(10) == -signal.SIGKILL
    assert victim_job.ranks[0].poll() is None and victim_job.ranks[1].poll() is None
    down = await health.wait_for(lambda r: "node_down" in r.faults)
    assert not down.healthy

    cleared = await fire(faults.FailNode(node="node-1", clear=True), victim_job.context())
    assert cleared.ok, cleared.detail
    back = await health.wait_for(lambda r: "node_down" not in r.faults)
    assert back.faults == []


async def test_gpu_xid_without_injection_enabled_fails_with_the_reason(victim_job: VictimJob):
    health = await HealthTap(victim_job.bus, victim_job.job).start()
    victim_job.extra.append(
        start_hostmon(victim_job.url, victim_job.state_dir, victim_job.job, "node-0")
    )
    await health.wait_for(lambda r: r.node == "node-0")
    outcome = await fire(faults.GpuXid(node="node-0", xid=48), victim_job.context())
    assert not outcome.ok and "fault injection disabled" in outcome.detail


async def test_gpu_xid_reaches_the_host_monitor(victim_job: VictimJob):
    health = await HealthTap(victim_job.bus, victim_job.job).start()
    victim_job.extra.append(
        start_hostmon(
            victim_job.url,
            victim_job.state_dir,
            victim_job.job,
            "node-0",
            "enable_fault_injection=true",
            "health_interval_s=600",
        )
    )
    await health.wait_for(lambda r: r.node == "node-0")
    ctx = victim_job.context()
    outcome = await fire(faults.GpuXid(node="node-0", xid=48), ctx)
    assert outcome.ok, outcome.detail
    assert (await health.wait_for(lambda r: not r.healthy)).faults == ["gpu_xid:48"]
    assert (await fire(faults.GpuXid(node="node-0", clear=True), ctx)).ok
    assert (await health.wait_for(lambda r: r.healthy)).faults == []
    await ctx.close()


async def test_slow_rank_pauses_and_always_resumes(victim_job: VictimJob):
    pid = victim_job.ranks[0].pid
    ctx = victim_job.context()
    task = asyncio.create_task(
        fire(faults.SlowRank(rank=0, factor=4, duration_s=1.5, period_s=0.1), ctx)
    )
    states = set()
    while not task.done():
        states.add(process_state(pid))
        await asyncio.sleep(0.01)
    outcome = task.result()
    assert outcome.ok and "1/4 speed" in outcome.detail
    assert psutil.STATUS_STOPPED in states, "the duty cycle stopped the rank"
    assert process_state(pid) != psutil.STATUS_STOPPED, "the rank runs again at the end"
    await ctx.close()


@pytest.mark.slow  # the `goodput` CLI starts slowly (other subcommands import torch)
async def test_detached_slow_rank_runs_in_the_background_and_clears(victim_job: VictimJob):
    pid = victim_job.ranks[1].pid
    result = await victim_job.cli(
        "slow-rank",
        "--rank",
        "1",
        "--factor",
        "3",
        "--duration",
        "60",
        "--period",
        "0.1",
        "--method",
        "sigstop",
        "--detach",
    )
    assert result.returncode == 0, result.stderr
    assert "background" in result.stdout
    record = StateDir(victim_job.state_dir).slow_rank_record(victim_job.job, 1)
    assert record.exists()
    seen_stopped = False
    for _ in range(300):
        if process_state(pid) == psutil.STATUS_STOPPED:
            seen_stopped = True
            break
        await asyncio.sleep(0.01)
    assert seen_stopped
    assert "resumed" in stop_detached(victim_job.state_dir, victim_job.job, 1)
    assert not record.exists()
    assert process_state(pid) != psutil.STATUS_STOPPED


async def test_slow_rank_asks_an_injectable_ranks_shim_to_stretch_its_compute(
    victim_job: VictimJob,
):
    """Rank 1 allows fault injection: its own compute is slowed, then restored; rank 0 does not,
    so slowing its compute is refused in one line (auto falls back to the duty cycle there)."""
    ctx = victim_job.context()
    outcome = await fire(faults.SlowRank(rank=1, factor=1.5, duration_s=0.3), ctx)
    assert outcome.ok and "compute 1.5× as long" in outcome.detail
    refused = await fire(faults.SlowRank(rank=0, factor=1.5, method="compute"), ctx)
    assert not refused.ok and "GOODPUT_ENABLE_FAULT_INJECTION" in refused.detail
    await ctx.close()

    commands = await _trainer_commands(victim_job, 2)
    assert [(c.fault, c.node, c.detail, c.factor, c.duration_s, c.clear) for c in commands] == [
        ("slow", "node-0", "1", 1.5, 0.3, False),
        ("slow", "node-0", "1", 1.0, 0.0, True),
    ]


async def test_hang_rank_sends_the_trainer_an_inject_fault(victim_job: VictimJob):
    ctx = victim_job.context()
    outcome = await fire(faults.HangRank(rank=1), ctx)
    assert outcome.ok and "WARNING" not in outcome.detail  # rank 1 was started injectable
    warned = await fire(faults.HangRank(rank=2), ctx)
    assert warned.ok and "GOODPUT_ENABLE_FAULT_INJECTION" in warned.detail
    await ctx.close()

    commands = await _trainer_commands(victim_job, 2)
    assert [(c.fault, c.node, c.detail, c.clear) for c in commands] == [
        ("hang", "node-0", "1", False),
        ("hang", "node-1", "2", False),
    ]
    assert all(isinstance(c, schemas.InjectFault) for c in commands)


async def test_a_restarted_rank_is_found_by_its_new_pid(victim_job: VictimJob):
    replacement = start_rank(victim_job.job, "node-0", 0)
    victim_job.extra.append(replacement)
    await put_job_status(
        victim_job.bus, victim_job.job, {"node-0": [replacement.pid, victim_job.ranks[1].pid]}
    )
    outcome = await fire(faults.KillRank(rank=0), victim_job.context())
    assert outcome.ok and str(replacement.pid) in outcome.target
    assert replacement.wait(10) == -signal.SIGKILL
    assert victim_job.ranks[0].poll() is None


async def test_numerical_faults_send_the_trainer_an_inject_fault(victim_job: VictimJob):
    """nan and loss-spike name a rank, sdc a node (every rank of it: one replica)."""
    result = await victim_job.cli("sdc", "--node", "node-0", "--json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert (outcome["fault"], outcome["target"], outcome["ok"]) == ("sdc", "node-0", True)
    # rank 0 of node-0 was started without fault injection: its shim will refuse
    assert "ranks 0, 1 flip" in outcome["detail"] and "rank(s) 0 were started" in outcome["detail"]
    ctx = victim_job.context()
    nan = await fire(faults.NanLoss(rank=1), ctx)
    assert nan.ok and "WARNING" not in nan.detail, nan.detail
    spike = await fire(faults.LossSpike(rank=3, factor=5), ctx)
    assert spike.ok and "loss × 5" in spike.detail and "WARNING" in spike.detail
    await ctx.close()

    commands = await _trainer_commands(victim_job, 3)
    assert [(c.fault, c.node, c.detail, c.factor) for c in commands] == [
        ("sdc", "node-0", "", 1.0),
        ("nan", "node-0", "1", 1.0),
        ("loss-spike", "node-1", "3", 5.0),
    ]


def test_numerical_fault_arguments_are_checked_before_anything_is_sent() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"rank": 0, "factor": 1.0}, faults.LossSpike)
