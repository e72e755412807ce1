"""What a node agent reads from Slurm's environment (pure)."""

from __future__ import annotations

import pytest

from goodput.supervisor.agent.slurm import (
    SlurmEnvError,
    agent_node_name,
    expand_nodelist,
    read_slurm,
)


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("gpu[001-003,007]", ["gpu001", "gpu002", "gpu003", "gpu007"]),
        ("gpu[001-002],cpu1", ["gpu001", "gpu002", "cpu1"]),
        ("node7", ["node7"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]),
        ("", []),
    ],
)
def test_the_node_list_expands_as_slurm_writes_it(nodelist: str, names: list[str]) -> None:
    assert expand_nodelist(nodelist) == names


@pytest.mark.parametrize("nodelist", ["gpu[001-003", "gpu001]", "gpu[3-1]", "gpu[a-b]"])
def test_a_malformed_node_list_is_one_error_naming_it(nodelist: str) -> None:
    with pytest.raises(SlurmEnvError, match=r"node range|unbalanced"):
        expand_nodelist(nodelist)


STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[001-003,007]",
    "SLURM_NNODES": "4",
    "SLURMD_NODENAME": "gpu003",
    "SLURM_NODEID": "2",
    "SLURM_GPUS_ON_NODE": "8",
}


def test_a_job_step_says_which_node_this_is_and_its_gpus() -> None:
    job = read_slurm(STEP)
    assert job is not None
    assert (job.job_id, job.node, job.node_index, job.gpus_on_node) == ("4242", "gpu003", 2, 8)
    assert job.nodes == ["gpu001", "gpu002", "gpu003", "gpu007"]
    assert agent_node_name(STEP) == "gpu003"


def test_the_node_name_falls_back_to_the_node_id_and_becomes_a_subject_token() -> None:
    env = {**STEP, "SLURM_JOB_NODELIST": "a.b[1-2]", "SLURM_NNODES": "2", "SLURM_NODEID": "1"}
    del env["SLURMD_NODENAME"]
    assert agent_node_name(env) == "a-b2"


def test_outside_slurm_there_is_no_job_and_no_name() -> None:
    assert read_slurm({}) is None
    assert agent_node_name({"SLURM_NODEID": "1"}) == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_NNODES": "3"}, "SLURM_NNODES=3 but SLURM_JOB_NODELIST names 4"),
        ({"SLURMD_NODENAME": "gpu009"}, "not in SLURM_JOB_NODELIST"),
        ({"SLURM_GPUS_ON_NODE": "eight"}, "SLURM_GPUS_ON_NODE='eight' is not a count"),
    ],
)
def test_inconsistent_values_are_refused_naming_the_variable(change: dict, message: str) -> None:
    with pytest.raises(SlurmEnvError, match=message):
        read_slurm({**STEP, **change})
