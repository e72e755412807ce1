"""The layering rules of pyproject.toml ([tool.importlinter]) hold: the library does not import
the services, no service package imports another, the pure decision cores (detect,
control, policy) reach no bus, nats or torch, and the library's parts stand in their layers
(tools over the public faces, over the shim and the supervisor, over checkpointing,
measurement and the launch contracts, over the bus and the messages)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    command = str(lint_imports) if lint_imports.exists() else shutil.which("lint-imports")
    assert command, "lint-imports is not installed (the dev extra has import-linter)"
    result = subprocess.run(
        [command, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "libs"), str(ROOT / "services"), os.environ.get("PYTHONPATH", "")]
            ),
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout, result.stdout
