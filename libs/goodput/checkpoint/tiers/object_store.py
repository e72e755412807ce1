"""The object-store tier: a narrow put/get/stat/list/delete interface and its local default.

Both implementations publish atomically (a reader sees the whole object or none) and record
the object's xxh3_128 so downloads are verified end to end, independent of the transport.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from goodput.checkpoint.format import ChecksumMismatch, copy_and_hash, publish, write_file_durably


class ObjectStoreUnavailable(ConnectionError):
    """The store cannot be reached; the operation may succeed on retry once it is back."""


class ObjectNotFound(KeyError):
    """No object under that key."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    xxh3_128: str | None


class ObjectStore(Protocol):
    def put_file(self, key: str, path: Path, xxh3_128: str | None = None) -> None:
        """Upload ``path``; its checksum is computed when not given."""

    def get_file(self, key: str, dest: Path, xxh3_128: str | None = None) -> None:
        """Download to ``dest`` atomically, verifying against ``xxh3_128`` or the stored one."""

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes: ...

    def stat(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str) -> Iterator[str]: ...

    def delete(self, key: str) -> None: ...


def validate_key(key: str) -> str:
    path = PurePosixPath(key)
    if not key or path.is_absolute() or any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"invalid object key: {key!r}")
    if any(p.startswith(".") for p in path.parts):
        raise ValueError(f"object key parts may not start with '.': {key!r}")
    return key


class DirectoryObjectStore:
    """Objects as files under a directory: the embedded default and a stand-in for a bucket
    mounted through a filesystem. The checksum lives in a hidden sidecar next to the object."""

    def __init__(self, path: Path) -> None:
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    @staticmethod
    def _checksum_path(path: Path) -> Path:
        return path.with_name(f".{path.name}.xxh3_128")

    def put_file(self, key: str, path: Path, xxh3_128: str | None = None) -> None:
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = final.with_name(f".{final.name}.{os.getpid()}.upload")
        try:
            digest = copy_and_hash(Path(path), temp)
            if xxh3_128 is not None and digest != xxh3_128:
                raise ChecksumMismatch(f"{path}: xxh3_128 {digest}, expected {xxh3_128}")
            write_file_durably(self._checksum_path(final), digest.encode())
            publish(temp, final)
        finally:
            temp.unlink(missing_ok=True)

    def get_file(self, key: str, dest: Path, xxh3_128: str | None = None) -> None:
        source = self._path(key)
        if not source.is_file():
            raise ObjectNotFound(key)
        expected = xxh3_128 or self._stored_checksum(source)
        dest = Path(dest)
        temp = dest.with_name(f".{dest.name}.{os.getpid()}.download")
        try:
            digest = copy_and_hash(source, temp)
            if expected is not None and digest != expected:
                raise ChecksumMismatch(f"object {key}: xxh3_128 {digest}, expected {expected}")
            publish(temp, dest)
        finally:
            temp.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        write_file_durably(self._path(key), data)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc

    def stat(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file():
            return None
        return ObjectInfo(key, path.stat().st_size, self._stored_checksum(path))

    def _stored_checksum(self, path: Path) -> str | None:
        try:
            return self._checksum_path(path).read_text().strip()
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> Iterator[str]:
        if any(part in (".", "..") for part in prefix.split("/")):
            raise ValueError(f"invalid prefix: {prefix!r}")
        start = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    yield key

    def delete(self, key: str) -> None:
        path = self._path(key)
        self._checksum_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def open_object_store(spec: str, gcs_endpoint: str = "", retry_s: float = 20.0) -> ObjectStore:
    """The store named by ``spec``: ``dir:<path>`` or ``gcs:<bucket>`` (optionally an emulator)."""
    kind, _, where = spec.partition(":")
    if kind == "dir" and where:
        return DirectoryObjectStore(Path(where))
    if kind == "gcs" and where:
        from goodput.checkpoint.tiers.gcs import (
            GcsObjectStore,  # google-cloud-storage only when needed
        )

        return GcsObjectStore(where, _gcs_client(gcs_endpoint), retry_timeout_s=retry_s)
    raise SystemExit(f"object_store must be 'dir:<path>' or 'gcs:<bucket>', got {spec!r}")


def _gcs_client(endpoint: str):
    from google.cloud import storage

    if not endpoint:
        return storage.Client()  # Application Default Credentials
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    return storage.Client(
        project="goodput-local",
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=endpoint),
    )


def store_uri(spec: str) -> str:
    kind, _, where = spec.partition(":")
    return f"gs://{where}" if kind == "gcs" else f"file://{where}"
