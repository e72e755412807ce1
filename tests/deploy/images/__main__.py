"""`python -m tests.deploy.images` (`just test-images`): build both images, check that a code
change rebuilds only goodput's own layer, run the services and a rank; figures as JSON."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.deploy.images import podman, stack

#: the instruction of the dependency layer (the Dockerfile's first pip install)
DEPENDENCY_LAYER = "pip install --no-cache-dir -r /opt/goodput/build/requirements.txt"
#: the containers' name prefix
TAG = "goodput-test"


def timed(figures: dict, name: str, step) -> None:
    started = time.monotonic()
    step()
    figures[name] = round(time.monotonic() - started, 1)


def dependency_layer(tag: str) -> tuple[str, float]:
    """The id and MB of the image's dependency layer."""
    matches = [
        (layer, mb) for layer, mb, made_by in podman.layers(tag) if DEPENDENCY_LAYER in made_by
    ]
    if len(matches) != 1:
        raise podman.Failed(f"test-images: {tag} has {len(matches)} dependency layers, not one")
    return matches[0]


def code_change_rebuild(figures: dict) -> None:
    """A one-line change to goodput's source rebuilds the service image's last layers only:
    the dependency layer is the one already built, reused from the cache."""
    changed = f"{podman.SERVICE}-changed"
    with tempfile.TemporaryDirectory(prefix="goodput-context-") as tmp:
        context = podman.copy_context(Path(tmp))
        with (context / "libs" / "goodput" / "__init__.py").open("a") as source:
            source.write(f"# a code change at {time.time_ns()}\n")
        seconds = podman.build_target("service", changed, context, PYTHON_IMAGE=podman.PYTHON)
    try:
        same = dependency_layer(changed)[0] == dependency_layer(podman.SERVICE)[0]
    finally:
        subprocess.run(["podman", "rmi", changed], capture_output=True)
    if not same:
        raise podman.Failed("test-images: a code change rebuilt the dependency layer")
    figures["code_change_rebuild_s"] = round(seconds, 1)


def build(figures: dict) -> None:
    timed(figures, "setup_s", lambda: (podman.ensure_tools(), podman.configure_podman()))
    timed(figures, "debian_base_s", podman.debian_base)
    timed(figures, "python_base_s", podman.python_base)
    timed(figures, "training_base_s", podman.training_base)
    figures["service_build_s"] = round(
        podman.build_target("service", podman.SERVICE, PYTHON_IMAGE=podman.PYTHON), 1
    )
    figures["rank_build_s"] = round(
        podman.build_target("rank", podman.RANK, TRAINING_IMAGE=podman.TRAINING), 1
    )
    code_change_rebuild(figures)
    for name, tag in (
        ("python_base", podman.PYTHON),
        ("training_base", podman.TRAINING),
        ("service", podman.SERVICE),
        ("rank", podman.RANK),
    ):
        figures[f"{name}_mb"] = round(podman.size_mb(tag))
    figures["service_dependencies_mb"] = round(dependency_layer(podman.SERVICE)[1])
    figures["rank_over_training_mb"] = figures["rank_mb"] - figures["training_base_mb"]


def run(figures: dict, steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix="goodput-test-images-") as tmp:
        bench = stack.Bench(Path(tmp), TAG)
        bench.write_config()
        with bench.nats_server(), bench.s3_bucket():
            try:
                started = time.monotonic()
                bench.start_services(podman.SERVICE)
                stack.wait_healthy(bench, timeout_s=120)
                figures["services_healthy_s"] = round(time.monotonic() - started, 1)
                figures["rank_job_s"] = round(
                    stack.run_rank(bench, podman.SERVICE, podman.RANK, steps), 1
                )
                waited, steps = stack.s3_backup(bench, timeout_s=60)
                figures["s3_backup_after_job_s"], figures["s3_backed_up_steps"] = (
                    round(waited, 1),
                    steps,
                )
                stack.wait_healthy(bench, timeout_s=30)
                figures["status_sees_killed_actuator_s"] = round(
                    stack.status_sees_a_killed_service(bench, podman.SERVICE, "actuator", 60), 1
                )
            finally:
                bench.remove_containers()


def main() -> int:
    parser = argparse.ArgumentParser(prog="just test-images", description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true",
                        help="remove the cached base images first (to time a first run)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=20, help="steps of the rank's job")
    args = parser.parse_args()
    if args.cold:
        # the bases made anew, every layer above them misses the cache
        for tag in (podman.SERVICE, podman.RANK, podman.TRAINING, podman.PYTHON, podman.DEBIAN):
            subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)
    figures: dict = {"cold": args.cold}
    started = time.monotonic()
    try:
        build(figures)
        run(figures, args.steps)
    finally:  # what was measured, passed or not
        figures["total_s"] = round(time.monotonic() - started, 1)
        print(json.dumps(figures, indent=2))
    print("test-images: passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
