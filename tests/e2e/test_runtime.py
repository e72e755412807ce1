"""The whole loop with real services, real rank processes and the example job."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from pathlib import Path

import pytest

from goodput import schemas
from goodput.examples.gpt import supervised_argv
from goodput.measure.accounting import categories as c
from tests.conftest import goodput_cli
from tests.stack.helpers import job_on_stack

pytestmark = pytest.mark.slow

STEPS = "60"


def _demo(scenario: str, tmp_path: Path, *extra: str) -> dict:
    result = goodput_cli(
        "demo",
        "--scenario",
        scenario,
        "--steps",
        STEPS,
        "--json",
        "--state-dir",
        str(tmp_path / scenario),
        "--html",
        str(tmp_path / f"{scenario}-report"),
        *extra,
        timeout=600,
    )
    return json.loads(result.stdout)


def test_killed_twice_ends_bit_identical_to_an_uninterrupted_run(tmp_path: Path) -> None:
    reference = _demo("none", tmp_path)
    interrupted = _demo("kill-twice", tmp_path)
    assert reference["state"] == interrupted["state"] == "finished"
    assert reference["restarts"] == 0 and interrupted["restarts"] == 2
    assert interrupted["world_size_history"] == [2, 2, 2]
    assert [d["rule"] for d in interrupted["decisions"] if d["rule"] != "checkpoint-interval"] == [
        "in-process-restart",
        "hot-swap",
    ]
    assert interrupted["final_params_sha256"] == reference["final_params_sha256"]
    assert interrupted["steps"] == int(STEPS)
    # the run ends with its goodput report: the failures cost something, and it adds up. Each
    # run is judged against itself: two runs' percentages are not comparable on a shared machine
    # (a reference run slowed by a neighbour's test once reported less than the interrupted one)
    failure_costs = (c.FAILURE_DETECTION, c.DECISION, c.RESTART, c.WASTED_PROGRESS)
    assert all(reference["badput"][key] == 0 for key in failure_costs), reference["badput"]
    assert sum(interrupted["badput"][key] for key in failure_costs) > 0, interrupted["badput"]
    for run in (reference, interrupted):
        total = run["replay"]["total_s"]
        productive = total * run["goodput_pct"] / 100
        assert 0 < run["goodput_pct"] <= 100
        assert math.isclose(productive + sum(run["badput"].values()), total, rel_tol=1e-6)
    assert interrupted["goodput_pct"] < 100
    assert Path(interrupted["html_report"]).is_file()


def test_a_script_that_crashes_at_start_up_is_not_restarted_forever(tmp_path: Path) -> None:
    result = goodput_cli(
        "run",
        "--nodes",
        "1",
        "--spares",
        "0",
        "--json",
        "--timeout",
        "240",
        "--state-dir",
        str(tmp_path / "stack"),
        "--service-set",
        "controller:settings={crash_loop={window_s=60.0,max_restarts=2,backoff_s=0.5,max_backoffs=1}}",
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(3)",
        check=False,
        timeout=300,
    )
    summary = json.loads(result.stdout)
    assert result.returncode != 0
    # every rank exited 3 before its first step: `run` calls it a launch failure (no restart
    # can help) and stops the job, in one line on stderr and in its JSON on stdout
    assert summary["state"] == "launch failed", summary
    assert "exit code 3" in summary["refusal"], summary["refusal"]
    assert result.stderr.strip().splitlines()[-1] == f"goodput run: {summary['refusal']}"
    assert summary["restarts"] <= 4


def test_a_failed_node_is_hot_swapped_for_the_spare(tmp_path: Path) -> None:
    run = _demo("hot-swap", tmp_path)
    assert run["state"] == "finished" and run["steps"] == int(STEPS)
    assert run["world_size_history"] == [2, 2]
    assert "node-1" in run["failed_nodes"]
    assert any(d["rule"] == "hot-swap" for d in run["decisions"])
    # the ranks got the stack's checkpoint key: every manifest they or a peer wrote is signed
    manifests = list((tmp_path / "hot-swap" / "nodes").glob("*/*/*/**/manifest.json"))
    assert manifests and all(b'"manifest_hmac_sha256"' in m.read_bytes() for m in manifests)


#: rescale rule -> (global batch, accumulation steps, LR) at data-parallel sizes 2, 1, 2; the
#: example job runs a global batch of 12 in micro-batches of 1 at a peak LR of 3e-3
#: (global batch, accumulation steps, LR) at 2, 1 and 2 data-parallel ranks under the rule the
#: demo is given: the whole stack carries the rule to the ranks and their plans back (the
#: other rules' arithmetic is tests/shim/test_rescale.py's, without a stack)
RULE, RESCALED = "keep-global-batch", [(12, 6, 3e-3), (12, 12, 3e-3), (12, 6, 3e-3)]


def test_scale_down_without_a_spare_then_up_when_the_node_returns(tmp_path: Path) -> None:
    # the node is repaired at 40 % of the steps, once the job trained on without it
    run = _demo("scale-down-up", tmp_path, "--steps", "150", "--rescale", RULE)
    assert run["state"] == "finished" and run["steps"] == 150
    assert run["world_size_history"] == [2, 1, 2]
    rules = [d["rule"] for d in run["decisions"]]
    assert "scale-down" in rules and "scale-up" in rules
    # the rescale callbacks ran at each change of size, and the job's events say what they did
    plans = run["training_plans"]
    assert [p["dp_size"] for p in plans] == [2, 1, 2]
    assert [p["rescaled_from_dp"] for p in plans] == [0, 2, 1]
    assert all(p["callbacks"] for p in plans[1:])
    for plan, (batch, accumulation, lr) in zip(plans, RESCALED, strict=True):
        assert (plan["global_batch"], plan["accumulation_steps"]) == (batch, accumulation)
        assert math.isclose(plan["lr"], lr)


async def test_a_rank_dying_during_rendezvous_ends_in_a_running_job(tmp_path: Path) -> None:
    """Killed while the group forms (before any step): restarted, and the job completes."""
    start = schemas.StartJob(
        job="rdzv",
        argv=supervised_argv(30),
        nodes=2,
        procs_per_node=1,
        spares=0,
    )
    async with job_on_stack(tmp_path / "stack", "rdzv", 2, start) as (_, tap):
        started = await tap.wait_for(
            lambda e: isinstance(e, schemas.RankStarted) and e.rank == 1 and e.attempt == 1
        )
        os.kill(started.pid, signal.SIGKILL)
        assert not tap.of(schemas.StepDone)  # it died before the group made any step
        finished = await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished", timeout_s=180
        )
        assert finished.attempt >= 2 and finished.world_size == 2
