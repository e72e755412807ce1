"""The images, checked without building them: the service image installs goodput without
torch, and no service module needs torch; the rank image keeps the training image's torch."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
REQUIREMENTS = ROOT / "deploy" / "docker" / "requirements.py"

#: imports every module of the services with torch made unimportable
IMPORT_WITHOUT_TORCH = """
import importlib, pkgutil, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is not in the service image ({name})")
sys.meta_path.insert(0, NoTorch())
import goodput_services
walk = pkgutil.walk_packages(goodput_services.__path__, "goodput_services.")
names = [m.name for m in walk if not m.name.endswith(".__main__")]  # those run the service
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def _stages() -> dict[str, str]:
    """The Dockerfile's build stages by target name (continuation lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in lines:
        match = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line)
        if match:
            current = stages.setdefault(match.group(2), [line])
        else:
            current.append(line)
    return {name: "\n".join(body) for name, body in stages.items()}


def _pip_installs(stage: str) -> list[str]:
    return [i.strip() for i in re.findall(r"pip install ([^&\n]+)", stage)]


def test_the_service_requirements_are_goodputs_without_torch() -> None:
    out = subprocess.run(
        [sys.executable, str(REQUIREMENTS), "--pyproject", str(ROOT / "pyproject.toml"),
         "--without", "torch"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [r for r in out if r.lower().startswith("torch")]
    assert sorted(out) == sorted(d for d in dependencies if not d.startswith("torch"))


def test_both_images_install_goodput_without_its_torch_requirement() -> None:
    stages = _stages()
    assert set(stages) == {"service", "rank"}
    assert "FROM ${TRAINING_IMAGE} AS rank" in stages["rank"]
    for name, stage in stages.items():
        installs = _pip_installs(stage)
        assert installs == [
            "--no-cache-dir -r /tmp/requirements.txt",
            "--no-cache-dir --no-deps .",
        ]
        assert "requirements.py --without torch > /tmp/requirements.txt" in stage, name
    # the service image's build fails if torch slipped in anyway
    assert "find_spec('torch') is not None" in stages["service"]


def test_no_service_module_imports_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_WITHOUT_TORCH], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # every module of the five services was imported, not a part of them
    on_disk = [
        path
        for path in (ROOT / "services" / "goodput_services").rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    ]
    assert int(result.stdout) >= len(on_disk) > 0
