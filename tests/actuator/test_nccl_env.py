"""The NCCL error handling an in-process restart needs reaches every rank the actuator starts
(here a rank pod of the Kubernetes backend, against its API fake), and a value the job sets in
its own environment wins."""

from __future__ import annotations

import msgspec

from goodput.launch.rank_env import NCCL_ERROR_HANDLING

from .kubernetes_fake import _env, _start


async def test_rank_pods_get_nccl_error_handling_unless_the_job_sets_it(rig) -> None:
    backend, api, _ = rig
    await backend.start_job(_start())
    for pod in api.created:
        env = _env(pod)
        assert {k: env[k] for k in NCCL_ERROR_HANDLING} == NCCL_ERROR_HANDLING
    await backend.stop("next run")
    first_run = len(api.created)
    own = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "GOODPUT_CKPT_EVERY": "20"}
    await backend.start_job(msgspec.structs.replace(_start(), env=own))
    second_run = api.created[first_run:]
    assert second_run
    assert {_env(p)["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for p in second_run} == {"1"}


async def test_a_rank_pod_binds_the_first_gpu_it_holds(rig) -> None:
    """A pod holds its own GPUs (``gpus_per_rank``): local rank 1's pod sees one GPU, device
    0, which the shim binds (``local_rank`` would name a GPU the pod does not have); a CPU pod
    is told no device."""
    backend, api, _ = rig
    await backend.start_job(_start())
    assert {(_env(p)["LOCAL_RANK"], _env(p)["GOODPUT_DEVICE"]) for p in api.created} == {
        ("0", "0"),
        ("1", "0"),
    }
    await backend.stop("next run")
    first_run = len(api.created)
    await backend.start_job(msgspec.structs.replace(_start(), gpus_per_rank=0))
    assert all("GOODPUT_DEVICE" not in _env(p) for p in api.created[first_run:])
