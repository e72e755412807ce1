"""Print goodput's runtime requirements from pyproject.toml, less the ones named.

The Dockerfile installs the images' dependency layer from this list with ``--without torch
--build-requires``, so pyproject.toml stays the one place that names goodput's dependencies:
    python deploy/docker/requirements.py --without torch --build-requires > requirements.txt
``--build-requires`` adds what building goodput needs (``[build-system] requires``): the layer
holds it, and goodput's own layer builds without an isolated environment fetched from PyPI.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path


def requirement_name(requirement: str) -> str:
    """The distribution name of a requirement string, normalized (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: Path, without: set[str], build_requires: bool = False) -> list[str]:
    project = tomllib.loads(pyproject.read_text())
    dependencies = project["project"]["dependencies"]
    dropped = {requirement_name(name) for name in without}
    unknown = dropped - {requirement_name(d) for d in dependencies}
    if unknown:
        raise SystemExit(f"not a dependency of goodput: {', '.join(sorted(unknown))}")
    build = project["build-system"]["requires"] if build_requires else []
    return [d for d in dependencies if requirement_name(d) not in dropped] + build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--without", action="append", default=[], metavar="NAME")
    parser.add_argument(
        "--build-requires", action="store_true", help="add [build-system] requires"
    )
    args = parser.parse_args()
    print("\n".join(requirements(args.pyproject, set(args.without), args.build_requires)))


if __name__ == "__main__":
    main()
