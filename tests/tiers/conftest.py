"""Fixtures for the storage-tier tests: real checkpoint directories, real fake-gcs-server and
moto S3 server processes and real peer-server processes."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import xxhash

from goodput.checkpoint.format import (
    FileEntry,
    Manifest,
    build_manifest,
    read_manifest,
    step_dir,
    write_manifest,
)
from goodput.checkpoint.tiers.fake_gcs import FakeGcsServer, ensure_bucket
from goodput.checkpoint.tiers.gcs import GcsObjectStore
from goodput.checkpoint.tiers.peer import PeerServerProcess
from goodput.checkpoint.tiers.s3 import S3ObjectStore
from goodput.checkpoint.tiers.s3_emulator import EMULATOR_ENV, MotoS3Server
from goodput.checkpoint.tiers.s3_emulator import ensure_bucket as ensure_s3_bucket

BUCKET = "goodput-test"


def make_checkpoint(root: Path, step: int, files: dict[str, bytes]) -> Manifest:
    """Write a checkpoint the way the engine does: data files, then the sealed manifest."""
    directory = step_dir(root, step)
    directory.mkdir(parents=True)
    entries = []
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
        entries.append(
            FileEntry(name=name, size=len(data), xxh3_128=xxhash.xxh3_128_hexdigest(data))
        )
    write_manifest(directory, build_manifest(step, entries, metadata={"engine": "test"}))
    return read_manifest(directory)


def random_files(count: int, size: int, seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"rank{i}/shard.bin": rng.randbytes(size) for i in range(count)}


def visible_names(directory: Path) -> set[str]:
    """Files a checkpoint reader would see (hidden temp names excluded)."""
    return {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    }


@pytest.fixture
def ckpt():
    """Checkpoint-building helpers, as a fixture so test modules need no imports from here."""
    return SimpleNamespace(make=make_checkpoint, random_files=random_files, visible=visible_names)


@pytest.fixture(scope="module")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcsServer]:
    with FakeGcsServer(tmp_path_factory.mktemp("gcs")) as server:
        ensure_bucket(server.client(), BUCKET)
        yield server


@pytest.fixture
def gcs_store(fake_gcs: FakeGcsServer) -> GcsObjectStore:
    """Small parts so multi-part uploads and ranged parallel downloads are exercised."""
    return GcsObjectStore(BUCKET, fake_gcs.client(), part_bytes=1 << 20, retry_timeout_s=5)


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3Server]:
    """A moto S3 server; the module's clients find its keys through boto3's own chain."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in EMULATOR_ENV.items():
            env.setenv(name, value)
        with MotoS3Server() as server:
            ensure_s3_bucket(server.client(), BUCKET)
            yield server


@pytest.fixture
def s3_store(moto_s3: MotoS3Server) -> S3ObjectStore:
    """5 MiB parts (S3's least) so multipart uploads and ranged parallel downloads run, and
    listings of two keys a page so pagination does."""
    return S3ObjectStore(
        BUCKET, moto_s3.client(), part_bytes=5 << 20, retry_timeout_s=5, page_keys=2
    )


@pytest.fixture
def prefix() -> str:
    """A key prefix of its own per test: tests share one bucket."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[PeerServerProcess]:
    process = PeerServerProcess(tmp_path / "peer-volume")
    process.start()
    yield process
    process.stop()
