"""A job or stack bigger than the documented maxima or than this machine can run is refused in
one line before anything starts (issue 41, "Bounds"); so is a ``--job`` or ``--node`` of
``chaos`` and ``ckpt restore`` that is no subject token."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput.launch import capacity
from goodput.launch.capacity import HostFacts
from tests.cli.test_edge_validation import goodput
from tests.conftest import refused_in_one_line

#: a machine with room for 64 processes by CPU, about 32 by memory, plenty of threads, no GPU
HOST = HostFacts(cpus=8, available_memory_bytes=16 * 2**30, thread_headroom=100_000, gpus=0)


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (("run", "--procs-per-node", "100000"), ("100000 ranks per node", "maximum of 64")),
        (("run", "--nodes", "100000"), ("100000 node(s) + 1 spare(s)", "maximum of 4096")),
        (("run", "--standbys", "9"), ("9 standbys per node", "maximum of 8")),
        (("run", "--nodes", "300", "--spares", "0"), ("300 processes", "maximum of 256")),
        (("up", "--nodes", "100000"), ("100000 local nodes", "maximum of 64")),
        (("demo", "--nodes", "100000"), ("maximum of 4096",)),
        (("run", "--backend", "kubernetes", "--nodes", "5000"), ("maximum of 4096",)),
    ],
)
def test_a_shape_past_the_bounds_is_refused_before_anything_starts(
    tmp_path: Path, command: tuple[str, ...], words: tuple[str, ...]
) -> None:
    state = tmp_path / "state"
    argv = (*command, "--state-dir", str(state))
    if command[0] == "run":
        argv = (*argv, "--", "python", "-c", "0")
    result = goodput(*argv)
    assert result.returncode == 2, result.stderr
    refused_in_one_line(result, f"goodput {command[0]}:", *words)
    assert not state.exists()  # nothing was started


def test_run_refuses_two_local_nodes_of_eight_ranks_on_an_eight_gpu_machine(
    tmp_path: Path,
) -> None:
    """Issue 38: ``--nodes 2 --procs-per-node 8`` on one 8-GPU machine bound two ranks to each
    GPU, which NCCL refuses mid-start; the GPUs a rank here would see are
    ``CUDA_VISIBLE_DEVICES``, read without CUDA."""
    state = tmp_path / "state"
    argv = ("run", "--nodes", "2", "--procs-per-node", "8", "--spares", "0")
    result = goodput(
        *argv,
        "--state-dir",
        str(state),
        "--",
        "python",
        "-c",
        "0",
        CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7",
    )
    assert result.returncode == 2, result.stderr
    refused_in_one_line(
        result, "goodput run:", "16 ranks on a host", "fewer GPUs on this machine (8)"
    )
    assert not state.exists()


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (("chaos", "kill-rank", "--job", "a.b"), ("--job", "invalid job name 'a.b'")),
        (("chaos", "fail-node", "--node", "*"), ("--node", "invalid node name '*'")),
        (("ckpt", "restore", "--node", "a b"), ("--node", "invalid node name 'a b'")),
    ],
)
def test_a_job_or_node_flag_that_is_no_token_is_a_usage_error(
    tmp_path: Path, command: tuple[str, ...], words: tuple[str, ...]
) -> None:
    result = goodput(*command, "--state-dir", str(tmp_path))
    assert result.returncode == 2
    refused_in_one_line(result, *words)


def test_a_local_job_is_bounded_by_cpus_memory_threads_and_gpus() -> None:
    def problems(host: HostFacts = HOST, **shape: int) -> list[str]:
        full = {"nodes": 2, "procs_per_node": 1, "spares": 1, "standbys": 0, **shape}
        return capacity.local_job_problems(**full, host=host)

    assert problems() == []
    # 4 nodes x (7 ranks + 1 standby) = 32: the memory (16 GiB / 512 MiB) allows just that
    assert problems(nodes=3, procs_per_node=7, standbys=1) == []
    [memory] = problems(nodes=3, procs_per_node=8, standbys=1)
    assert "36 processes" in memory and "18.0 GiB of memory, 16.0 GiB available" in memory
    few_cpus = HostFacts(cpus=1, available_memory_bytes=2**40, thread_headroom=10**6, gpus=0)
    assert "more than 8 per CPU of this machine's 1 CPU(s)" in problems(few_cpus, nodes=8)[0]
    few_threads = HostFacts(cpus=64, available_memory_bytes=2**40, thread_headroom=100, gpus=0)
    assert problems(few_threads) == []  # 3 processes x 32 threads
    assert "about 128 threads, 100 more allowed" in problems(few_threads, nodes=3)[0]
    two_gpus = HostFacts(cpus=64, available_memory_bytes=2**40, thread_headroom=10**6, gpus=2)
    assert problems(two_gpus, nodes=1, procs_per_node=2) == []
    assert (
        "3 ranks on a host but fewer GPUs on this machine (2): NCCL needs a GPU per rank"
        in problems(two_gpus, nodes=1, procs_per_node=3)[0]
    )
    # every local node is this machine: 2 nodes x 8 ranks on 8 GPUs is two ranks per GPU
    eight_gpus = HostFacts(cpus=64, available_memory_bytes=2**40, thread_headroom=10**6, gpus=8)
    assert problems(eight_gpus, nodes=1, procs_per_node=8) == []
    [shared] = problems(eight_gpus, nodes=2, procs_per_node=8)
    assert "16 ranks on a host but fewer GPUs on this machine (8)" in shared
    assert problems(eight_gpus, nodes=2, procs_per_node=4) == []


def test_a_rank_binds_a_gpu_no_other_rank_of_its_host_binds() -> None:
    """``local_rank % count`` bound two ranks to one GPU; the index is now refused instead."""
    assert [capacity.rank_device(r, 8, visible=8) for r in range(8)] == list(range(8))
    assert capacity.rank_device(5, 8, visible=1) == 0  # a pod holding its own GPU
    # the local backend assigns node 1's ranks the GPUs after node 0's
    assert capacity.rank_device(1, 4, visible=8, assigned=5) == 5
    with pytest.raises(capacity.DeviceSharingError, match="local rank 5 of 8 but this process"):
        capacity.rank_device(5, 8, visible=4)
    with pytest.raises(capacity.DeviceSharingError, match="device 8 assigned to local rank 0"):
        capacity.rank_device(0, 8, visible=8, assigned=8)
    with pytest.raises(capacity.DeviceSharingError):
        capacity.rank_device(1, 2, visible=1, assigned=1)  # one GPU, two local ranks


def test_hosts_that_declare_fewer_gpus_than_ranks_are_named() -> None:
    """The agent backend's check: a host declaring no GPU runs CPU ranks (gloo)."""
    declared = {f"node-{i}": 4 for i in range(8)} | {"cpu-0": 0}
    assert capacity.gpu_problems(4, declared) == []
    [short] = capacity.gpu_problems(8, declared)
    assert "fewer GPUs on node-0 (4), node-1 (4), node-2 (4), node-3 (4) and 4 more" in short


def test_a_local_stack_is_bounded_by_its_services() -> None:
    assert capacity.local_stack_problems(nodes=4, host=HOST) == []
    [cpus] = capacity.local_stack_problems(nodes=40, host=HOST)
    assert "40 local node(s)' 80 services" in cpus and "per CPU" in cpus
    assert capacity.local_stack_problems(nodes=65, host=HOST) == [
        "65 local nodes exceed the maximum of 64"
    ]
