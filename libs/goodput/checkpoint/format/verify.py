"""Is a checkpoint directory complete and intact? Sizes first (cheap), then every byte."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from goodput.checkpoint.format.file_entry import FileEntry
from goodput.checkpoint.format.files import file_xxh3_128
from goodput.checkpoint.format.layout import MANIFEST_NAME, parse_step_dir
from goodput.checkpoint.format.manifest import Manifest, ManifestError, read_manifest


@dataclass(frozen=True)
class VerifyProblem:
    """One reason a checkpoint directory cannot be trusted."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def check_file_sizes(checkpoint_dir: Path, manifest: Manifest) -> list[VerifyProblem]:
    """Cheap completeness check: every listed file is a regular file of the listed size."""
    problems = []
    for entry in manifest.files:
        try:
            info = os.stat(checkpoint_dir / entry.name)
        except FileNotFoundError:
            problems.append(VerifyProblem(entry.name, "missing"))
            continue
        except OSError as exc:
            problems.append(VerifyProblem(entry.name, f"unreadable ({exc.strerror or exc})"))
            continue
        if not stat.S_ISREG(info.st_mode):
            problems.append(VerifyProblem(entry.name, "not a regular file"))
        elif info.st_size != entry.size:
            problems.append(
                VerifyProblem(entry.name, f"size {info.st_size} != {entry.size} in manifest")
            )
    return problems


def check_sealed(checkpoint_dir: str | os.PathLike) -> tuple[Manifest | None, list[VerifyProblem]]:
    """The manifest (None if unusable) and every reason not to trust ``checkpoint_dir``
    short of reading its data: the manifest verifies against its own seal and names the
    directory's step, and every file it lists is a regular file of the listed size.

    Enough for a copy whose bytes were hashed against the manifest when they were written
    or received: a torn or truncated file still fails here; bit rot needs the full check.
    """
    checkpoint_dir = Path(checkpoint_dir)
    try:
        manifest = read_manifest(checkpoint_dir)
    except ManifestError as exc:
        return None, [VerifyProblem(MANIFEST_NAME, str(exc))]
    named = parse_step_dir(checkpoint_dir.name)
    if named is not None and named != manifest.step:
        return manifest, [VerifyProblem(MANIFEST_NAME, f"manifest says step {manifest.step}")]
    return manifest, check_file_sizes(checkpoint_dir, manifest)


def verify_manifest_and_files(
    checkpoint_dir: str | os.PathLike, *, threads: int = 1
) -> tuple[Manifest | None, list[VerifyProblem]]:
    """:func:`check_sealed`, then every data file read in full (``threads`` files at once:
    a disk serves several requests in flight faster than one) against its xxh3_128 digest.
    """
    checkpoint_dir = Path(checkpoint_dir)
    manifest, problems = check_sealed(checkpoint_dir)
    if manifest is None or any(p.name == MANIFEST_NAME for p in problems):
        return manifest, problems
    broken = {problem.name for problem in problems}
    entries = [entry for entry in manifest.files if entry.name not in broken]
    with ThreadPoolExecutor(max(1, min(threads, len(entries) or 1))) as pool:
        outcomes = list(pool.map(lambda entry: _check_digest(checkpoint_dir, entry), entries))
    problems.extend(problem for problem in outcomes if problem is not None)
    return manifest, problems


def _check_digest(checkpoint_dir: Path, entry: FileEntry) -> VerifyProblem | None:
    try:
        digest = file_xxh3_128(checkpoint_dir / entry.name)
    except OSError as exc:
        return VerifyProblem(entry.name, f"unreadable ({exc.strerror or exc})")
    if digest != entry.xxh3_128:
        return VerifyProblem(entry.name, "xxh3_128 mismatch")
    return None


def verify_files(checkpoint_dir: str | os.PathLike, *, threads: int = 1) -> list[VerifyProblem]:
    """Every reason not to trust ``checkpoint_dir`` (empty list: complete and intact)."""
    return verify_manifest_and_files(checkpoint_dir, threads=threads)[1]
