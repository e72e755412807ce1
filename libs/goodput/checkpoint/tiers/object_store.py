"""The object-store tier: a narrow put/get/stat/list/delete interface and its local default.

Both implementations publish atomically (a reader sees the whole object or none) and record
the object's xxh3_128 so downloads are verified end to end, independent of the transport.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from goodput.checkpoint.format import (
    ChecksumMismatch,
    copy_and_hash,
    file_xxh3_128,
    publish,
    write_file_durably,
)

#: the user-metadata field a remote store (GCS, S3) keeps each object's xxh3_128 in
CHECKSUM_METADATA_KEY = "xxh3_128"


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


def download_verified(
    key: str, dest: Path, expected: str | None, download: Callable[[Path], str | None]
) -> None:
    """Fetch object ``key`` into ``dest`` whole or not at all: ``download`` writes it to a
    temporary file beside ``dest`` (returning its xxh3_128 where it hashed while copying,
    else None), which is checked against ``expected`` (None: not checked) before it is
    published in one rename. A failed or mismatched download leaves nothing behind."""
    dest = Path(dest)
    temp = dest.with_name(f".{dest.name}.{os.getpid()}.download")
    try:
        digest = download(temp)
        if expected is not None:
            actual = digest if digest is not None else file_xxh3_128(temp)
            if actual != expected:
                raise ChecksumMismatch(f"object {key}: xxh3_128 {actual}, expected {expected}")
        publish(temp, dest)
    finally:
        temp.unlink(missing_ok=True)


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
        download_verified(key, dest, expected, lambda temp: copy_and_hash(source, temp))

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


class PrefixedStore:
    """Another store's objects under ``prefix/``: a store URI's path inside a bucket, so that
    jobs or clusters can share a bucket without seeing each other's keys."""

    def __init__(self, inner: ObjectStore, prefix: str) -> None:
        self.inner = inner
        self.prefix = f"{validate_key(prefix)}/"

    def put_file(self, key: str, path: Path, xxh3_128: str | None = None) -> None:
        self.inner.put_file(self.prefix + validate_key(key), path, xxh3_128)

    def get_file(self, key: str, dest: Path, xxh3_128: str | None = None) -> None:
        self.inner.get_file(self.prefix + validate_key(key), dest, xxh3_128)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.inner.put_bytes(self.prefix + validate_key(key), data)

    def get_bytes(self, key: str) -> bytes:
        return self.inner.get_bytes(self.prefix + validate_key(key))

    def stat(self, key: str) -> ObjectInfo | None:
        info = self.inner.stat(self.prefix + validate_key(key))
        return None if info is None else ObjectInfo(key, info.size, info.xxh3_128)

    def list(self, prefix: str) -> Iterator[str]:
        for key in self.inner.list(self.prefix + prefix):
            yield key[len(self.prefix) :]

    def delete(self, key: str) -> None:
        self.inner.delete(self.prefix + validate_key(key))
