"""A numerical rollback's bound reaches the ranks of the next attempt only (here rank pods of
the Kubernetes backend, against its API fake): a later relaunch resumes from the newest
checkpoint again."""

from __future__ import annotations

from goodput import schemas
from goodput.launch.rank_env import VARIABLES

from .kubernetes_fake import _env, _start

BOUND = VARIABLES["restore_before_step"]
SKIP = VARIABLES["skip_steps"]


async def test_only_the_rollback_attempt_restores_before_the_fault(rig) -> None:
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


async def test_skipped_batches_stay_skipped_in_every_later_attempt(rig) -> None:
    """Unlike the bound: a relaunch from a checkpoint before the window would otherwise train
    on the poisoned batch again."""
    backend, api, _ = rig
    await backend.start_job(_start())
    assert all(SKIP not in _env(pod) for pod in api.created)
    backend.roll_back_before(41)
    backend.skip_data(schemas.StepWindow(41, 45))
    before = len(api.created)
    await backend.restart("loss_spike: roll back")
    assert {_env(pod)[SKIP] for pod in api.created[before:]} == {"41-45"}
    backend.skip_data(schemas.StepWindow(90, 95))
    before = len(api.created)
    await backend.restart("a crash later")
    later = api.created[before:]
    assert later and {_env(pod)[SKIP] for pod in later} == {"41-45,90-95"}
    assert all(BOUND not in _env(pod) for pod in later)
