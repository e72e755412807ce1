"""``regroup_fsdp`` moves an FSDP2 model to a new process group in process: real ranks (gloo,
CPU), FSDP over two and HSDP (2 x 2) over four, AdamW with gradient clipping; a step is
abandoned mid-forward and another in a collective a peer's abort failed, the old group is
aborted and a new one formed on a new port, as an in-process restart does, and training goes
on bit for bit as if nothing had happened (``fsdp_regroup_rank.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.examples.launch import free_port

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("fsdp_regroup_rank.py")


@pytest.fixture(scope="module", params=["2", "2x2"], ids=["fsdp-2", "hsdp-2x2"])
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    shape: str = request.param
    world = 1
    for size in shape.split("x"):
        world *= int(size)
    out = tmp_path_factory.mktemp(f"fsdp-regroup-{shape}")
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world),
    )
    second_port = str(free_port())
    logs = [out / f"rank-{rank}.log" for rank in range(world)]
    processes = []
    for rank, log in enumerate(logs):
        with open(log, "wb") as sink:
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(JOB), str(out), shape, second_port],
                    env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        codes = [process.wait(timeout=300) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
    assert codes == [0] * world, f"exit codes {codes}\n{tails}"
    return [json.loads((out / f"result-{rank}.json").read_text()) for rank in range(world)]


def test_training_after_the_regroup_ends_bit_identical_to_an_uninterrupted_run(
    results: list[dict[str, Any]],
) -> None:
    for result in results:
        assert result["moved_before_regroup"]  # the restarted model had fewer steps then
        assert result["end_differs"] == []


def test_the_parameters_and_optimizer_state_stay_the_same_objects_and_bytes(
    results: list[dict[str, Any]],
) -> None:
    for result in results:
        assert result["same_objects"]
        assert result["registered_sharded"]  # the abandoned forward's unsharded ones are gone
        assert result["regroup_changed_bytes"] == []


def test_the_model_communicates_on_the_new_group_only(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert result["new_groups_registered"] and not result["new_groups_are_old"]
        assert not result["old_groups_registered"]
        assert result["failed_step_error"]  # abandoned in a collective its peer cut
        assert result["old_group_error"]  # the old group is gone: any use of it raises
        assert result["unregrouped_error"]  # the control: without the regroup, a step fails
        assert result["specs_on_new_mesh"] and result["op_outputs_on_new_mesh"]


def test_the_new_mesh_keeps_the_old_shape(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert result["mesh_shape"] == ([2] if result["world"] == 2 else [2, 2])


def test_unknown_internals_are_refused_in_one_line_and_change_nothing(
    results: list[dict[str, Any]],
) -> None:
    for result in results:
        refusal = result["refusal"]
        assert refusal["message"].startswith("regroup_fsdp does not know torch ")
        assert "_sharding_spec" in refusal["message"] and "\n" not in refusal["message"]
        assert refusal["unchanged"]
        assert refusal["plain_message"] == "regroup_fsdp: the model has no fully_shard module"
