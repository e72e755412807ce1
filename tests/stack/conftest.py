from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import goodput_cli


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Path]:
    """A running `goodput up` stack (embedded NATS + every service process); torn down after."""
    state_dir = tmp_path / "stack"
    goodput_cli("up", "--state-dir", str(state_dir), "--job", "job-a", "--wait", "20")
    yield state_dir
    goodput_cli("down", "--state-dir", str(state_dir), check=False)


def stack_status(state_dir: Path) -> dict:
    result = goodput_cli("status", "--state-dir", str(state_dir), "--json", check=False)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"status --json printed no JSON (exit {result.returncode}); stderr:\n{result.stderr}"
        ) from exc
