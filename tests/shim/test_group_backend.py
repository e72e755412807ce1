"""The group run_job creates: NCCL gets the error handling an in-process restart needs in the
process's environment before the group exists (torch reads it then); gloo is left alone."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from goodput.launch.rank_env import NCCL_ERROR_HANDLING
from goodput.shim.standby import group_backend


@pytest.fixture(autouse=True)
def _clean_env() -> Iterator[None]:
    """No NCCL variable before the test, none it set after (what was there is put back)."""
    saved = {name: os.environ.pop(name) for name in NCCL_ERROR_HANDLING if name in os.environ}
    yield
    for name in NCCL_ERROR_HANDLING:
        os.environ.pop(name, None)
    os.environ.update(saved)


def test_an_nccl_group_gets_the_error_handling() -> None:
    assert group_backend("nccl") == "nccl"
    assert {k: os.environ[k] for k in NCCL_ERROR_HANDLING} == NCCL_ERROR_HANDLING


def test_a_value_the_user_exported_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    group_backend("nccl")
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_a_gloo_group_is_left_alone() -> None:
    assert group_backend("gloo") == "gloo"
    assert not NCCL_ERROR_HANDLING.keys() & os.environ.keys()
