"""Podman on this machine, the images deploy/docker/Dockerfile builds FROM (a Debian base made
with debootstrap, Python on it, a training image with a CPU torch), and the two targets.

Base images stay in podman's store between runs: a warm run builds only goodput's layers.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
IGNOREFILE = ROOT / "deploy" / "docker" / "Dockerfile.dockerignore"
#: what the Dockerfile copies (the ignore file's allowlist)
CONTEXT = ("pyproject.toml", "README.md", "deploy/docker/requirements.py", "libs", "services")

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
DEBIAN = f"localhost/goodput-test/debian:{SUITE}"
PYTHON = f"localhost/goodput-test/python:{SUITE}"
TRAINING = f"localhost/goodput-test/training:{SUITE}"
SERVICE = "localhost/goodput-test/service:dev"
#: the uid and gid the service image and the manifests run the services as
SERVICE_UID = 10001
RANK = "localhost/goodput-test/rank:dev"

#: the test's training image only (users bring their own torch): a CPU build, from the wheel
#: directory this machine's pip serves it from where there is one, else PyTorch's CPU index
TORCH_SPEC = os.environ.get("GOODPUT_TEST_TORCH_SPEC", "torch==2.13.0+cpu")
WHEELS = Path(os.environ.get("GOODPUT_TEST_WHEELS", "/opt/wheels"))
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

#: command -> Debian package
TOOLS = {
    "podman": "podman",
    "buildah": "buildah",
    "debootstrap": "debootstrap",
    "newuidmap": "uidmap",
    "runc": "runc",
}
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
#: the host's CA bundle: where PyPI is reached through a TLS-inspecting proxy (as here), its CA
#: is in this bundle only. Build steps see it mounted over the image's (Debian's pip reads
#: the system bundle); it is in no layer
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONF_MARK = "# written by goodput's just test-images"


class Failed(SystemExit):
    """A step failed: one line for the user (the command's output is already on stderr)."""


def sh(*argv: str, stdin: bytes | None = None, capture: bool = False) -> str:
    """Run a command; its failure is one line naming it."""
    result = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE if capture else None)
    if result.returncode != 0:
        raise Failed(f"test-images: `{' '.join(argv[:4])} …` exited {result.returncode}")
    return result.stdout.decode() if capture else ""


def ensure_tools() -> list[str]:
    """Install the missing tools with apt (once); the packages installed."""
    if os.geteuid() != 0:
        raise Failed("test-images: needs root (podman's rootful store, debootstrap, apt-get)")
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        sh("apt-get", "update", "-q")
        sh("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", *missing)
    return missing


def host_ulimits() -> list[str]:
    """Open-file and process limits this host lets runc set: podman's defaults (1048576 open
    files, the host's process limit) fail every container on a VM without CAP_SYS_RESOURCE.
    Measured on such a VM (nofile 20000, nproc 96365, pid_max 32768): runc sets nofile up to
    the host's and nproc up to pid_max, where more processes cannot exist anyway."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    if nproc == resource.RLIM_INFINITY or nproc > pid_max:
        nproc = pid_max
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def build_args(trust: bool = True) -> list[str]:
    """For every `podman build`: the host's network and ulimits (RUN steps do not take
    containers.conf's default_ulimits), and (``trust``) its CA bundle, for pip; not where the
    step installs Debian's ca-certificates, which rewrites that file."""
    limits = [arg for limit in host_ulimits() for arg in ("--ulimit", limit)]
    mount = trust and HOST_CA_BUNDLE.is_file()
    return [
        "--network",
        "host",
        *limits,
        *(["-v", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if mount else []),
    ]


def configure_podman() -> None:
    """runc as the runtime (Debian's podman leaves crun out), the host's ulimits as default."""
    limits = ", ".join(f'"{limit}"' for limit in host_ulimits())
    text = (
        f'{CONF_MARK}\n[containers]\ndefault_ulimits = [{limits}]\n\n[engine]\nruntime = "runc"\n'
    )
    if CONTAINERS_CONF.exists() and not CONTAINERS_CONF.read_text().startswith(CONF_MARK):
        print(f"test-images: keeping the existing {CONTAINERS_CONF}; it must say:\n{text}")
        return
    CONTAINERS_CONF.write_text(text)


def image_exists(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag]).returncode == 0


def debian_base() -> None:
    """Debian minbase from Debian's mirror, imported as an image (no registry needed)."""
    if image_exists(DEBIAN):
        return
    with tempfile.TemporaryDirectory(prefix="goodput-debootstrap-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        sh("debootstrap", "--variant=minbase", SUITE, str(rootfs), MIRROR)
        # the packages' .deb files and the mirror's indexes: 80 MB no image needs
        for cached in (*rootfs.glob("var/cache/apt/archives/*.deb"),
                       *rootfs.glob("var/lib/apt/lists/*_*")):  # fmt: skip
            cached.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["podman", "import", "-", DEBIAN], stdin=tar.stdout)
        if tar.wait() != 0 or imported.returncode != 0:
            raise Failed(f"test-images: importing the debootstrap tree as {DEBIAN} failed")


def build_from(tag: str, containerfile: str, *extra: str, trust: bool = True) -> None:
    """An image from a Containerfile given as text (the bases the Dockerfile builds FROM)."""
    if image_exists(tag):
        return
    with tempfile.TemporaryDirectory(prefix="goodput-base-") as context:
        sh("podman", "build", *build_args(trust), *extra, "-t", tag, "-f", "-", context,
           stdin=containerfile.encode())  # fmt: skip


def python_base() -> None:
    """Debian's own Python 3.11 (PEP 668: pip refuses its site-packages; the images use a venv)."""
    build_from(
        PYTHON,
        f"FROM {DEBIAN}\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv"
        " ca-certificates && apt-get clean && rm -rf /var/lib/apt/lists/*\n",
        trust=False,
    )


def training_base() -> None:
    """A training image as users have them: torch in the image's Python (pip told to break
    PEP 668, as NGC-style images do). The CPU torch comes from this machine's wheel directory,
    mounted for this build step only; a plain `pip install torch` would fetch the CUDA build."""
    source = ["--find-links", "/wheels"] if WHEELS.is_dir() else ["--index-url", TORCH_CPU_INDEX]
    mount = ["-v", f"{WHEELS}:/wheels:ro"] if WHEELS.is_dir() else []
    build_from(
        TRAINING,
        f"FROM {PYTHON}\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends python3-pip"
        " && apt-get clean && rm -rf /var/lib/apt/lists/*"
        " && pip install --no-cache-dir --break-system-packages"
        f" {' '.join(source)} '{TORCH_SPEC}'\n",
        *mount,
    )


def build_target(target: str, tag: str, context: Path = ROOT, **arguments: str) -> float:
    """Build one of the Dockerfile's targets; the seconds it took."""
    args = [arg for key, value in arguments.items() for arg in ("--build-arg", f"{key}={value}")]
    started = time.monotonic()
    sh("podman", "build", *build_args(), "--layers", "-f", str(DOCKERFILE),
       "--ignorefile", str(IGNOREFILE), "--target", target, *args, "-t", tag, str(context))  # fmt: skip
    return time.monotonic() - started


def copy_context(dest: Path) -> Path:
    """The files the Dockerfile copies, in a directory of their own (to change one)."""
    for name in CONTEXT:
        source, target = ROOT / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return dest


def size_mb(tag: str) -> float:
    return int(sh("podman", "image", "inspect", "--format", "{{.Size}}", tag, capture=True)) / 1e6


#: podman history's size units (decimal), in MB
UNITS_MB = {"B": 1e-6, "kB": 1e-3, "MB": 1.0, "GB": 1e3}


def layers(tag: str) -> list[tuple[str, float, str]]:
    """(id, MB, the instruction that made it), newest first (podman 4.3's history prints
    sizes as "433 MB" whatever --human says)."""
    out = sh("podman", "history", "--no-trunc", "--format", "{{.ID}}\t{{.Size}}\t{{.CreatedBy}}",
             tag, capture=True)  # fmt: skip
    rows = []
    for line in out.splitlines():
        layer, size, created_by = line.split("\t", 2)
        number, unit = size.split()
        rows.append((layer, float(number) * UNITS_MB[unit], created_by))
    return rows
