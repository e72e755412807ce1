"""The frameworks the integration tests run against: skipped with a reason on a venv without
them (``just test-quick`` on a plain install), a failure where CI runs (``CI`` set, as CI
services set it and ``.ci/run`` does): CI installs every extra, so a missing one is a defect
there, not a reason to pass."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

#: importable module -> the goodput extra that installs it
EXTRAS = {"lightning": "lightning", "transformers": "hf", "torchdata": "torchdata"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require(module: str) -> ModuleType:
    """``module``, imported; a skip outside CI when it is not installed."""
    if in_ci():
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"install goodput[{EXTRAS[module]}]")
