"""A missing framework skips its tests with a reason on a plain venv and fails them in CI."""

from __future__ import annotations

import sys

import pytest

from tests.integrations.extras import require


def test_a_missing_extra_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setitem(sys.modules, "lightning", None)  # as if not installed
    with pytest.raises(pytest.skip.Exception, match=r"install goodput\[lightning\]"):
        require("lightning")


def test_a_missing_extra_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError):
        require("transformers")
