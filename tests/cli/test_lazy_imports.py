"""`goodput --help` and `goodput report` (terminal or JSON) import neither torch nor matplotlib:
the CLI imports only the module of the command given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from goodput.measure.accounting import write_event_log
from tests.accounting.scenario import scenario_events

HEAVY = ("torch", "matplotlib")


def imported_modules(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run the real `goodput` entry point under ``-X importtime``; the top-level packages it
    imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "goodput.tools.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    modules = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "goodput" in modules, result.stderr[-2000:]
    return result, modules


def test_help_imports_no_subcommand_module() -> None:
    result, modules = imported_modules("--help")
    assert result.returncode == 0
    assert "report" in result.stdout and "chaos" in result.stdout
    assert not modules & {*HEAVY, "rich", "nats"}


def test_report_as_json_imports_neither_torch_nor_matplotlib(tmp_path: Path) -> None:
    log = tmp_path / "small.jsonl"
    write_event_log(log, scenario_events())
    result, modules = imported_modules("report", "--events", str(log), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["total_s"] > 0
    assert not modules & set(HEAVY)


def test_report_with_plots_imports_matplotlib(tmp_path: Path) -> None:
    log = tmp_path / "small.jsonl"
    write_event_log(log, scenario_events())
    result, modules = imported_modules("report", "--events", str(log), "--html", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "matplotlib" in modules and "torch" not in modules
