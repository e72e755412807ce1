"""Print goodput's runtime requirements from pyproject.toml, less the ones named, plus extras.

The Dockerfile installs the images' dependency layer from this list with ``--without torch
--build-requires`` (and the service image ``--extras`` its build argument names), so
pyproject.toml stays the one place that names goodput's dependencies:
    python deploy/docker/requirements.py --without torch --build-requires --extras s3
``--build-requires`` adds what building goodput needs (``[build-system] requires``): the layer
holds it, and goodput's own layer builds without an isolated environment fetched from PyPI.
``--extras`` adds optional dependency groups by name, comma-separated (empty: none).
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


def requirements(
    pyproject: Path, without: set[str], build_requires: bool = False, extras: tuple[str, ...] = ()
) -> list[str]:
    project = tomllib.loads(pyproject.read_text())
    dependencies = project["project"]["dependencies"]
    dropped = {requirement_name(name) for name in without}
    unknown = dropped - {requirement_name(d) for d in dependencies}
    if unknown:
        raise SystemExit(f"not a dependency of goodput: {', '.join(sorted(unknown))}")
    optional = project["project"].get("optional-dependencies", {})
    missing = [extra for extra in extras if extra not in optional]
    if missing:
        known = ", ".join(sorted(optional))
        raise SystemExit(f"not an extra of goodput: {', '.join(missing)} (its extras: {known})")
    added = [d for extra in extras for d in optional[extra]]
    build = project["build-system"]["requires"] if build_requires else []
    return [d for d in dependencies if requirement_name(d) not in dropped] + added + build


def extra_names(text: str) -> tuple[str, ...]:
    """``--extras``' comma-separated names (blanks ignored, so an empty build argument is none)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--without", action="append", default=[], metavar="NAME")
    parser.add_argument("--build-requires", action="store_true", help="add [build-system] requires")
    parser.add_argument(
        "--extras", type=extra_names, default=(), metavar="A,B", help="add these extras"
    )
    args = parser.parse_args()
    listed = requirements(args.pyproject, set(args.without), args.build_requires, args.extras)
    print("\n".join(listed))


if __name__ == "__main__":
    main()
