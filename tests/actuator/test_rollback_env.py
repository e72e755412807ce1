"""A numerical rollback's bound reaches the ranks of the next attempt only (here rank pods of
the Kubernetes backend, against its API fake): a later relaunch resumes from the newest
checkpoint again."""

from __future__ import annotations

from goodput.launch.rank_env import VARIABLES

from .test_kubernetes_backend import _env, _start, rig  # noqa: F401

BOUND = VARIABLES["restore_before_step"]


async def test_only_the_rollback_attempt_restores_before_the_fault(rig) -> None:  # noqa: F811
    backend, api, _ = rig
    await backend.start_job(_start())
    assert all(BOUND not in _env(pod) for pod in api.created)
    before = len(api.created)
    backend.roll_back_before(41)
    await backend.restart("nonfinite: roll back")
    rolled = api.created[before:]
    assert rolled and {_env(pod)[BOUND] for pod in rolled} == {"41"}
    before = len(api.created)
    await backend.restart("a crash later")  # its command carries no bound: nor do its ranks
    later = api.created[before:]
    assert later and all(BOUND not in _env(pod) for pod in later)
