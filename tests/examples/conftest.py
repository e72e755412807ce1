"""Fixtures of the example-job tests: rank launchers that clean up after themselves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.examples.launch import Launcher


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.close()


@pytest.fixture(scope="module")
def module_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path_factory.mktemp("logs"))
    yield launcher
    launcher.close()


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Like every rank of the job: the machine's few cores are shared, so one thread each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
