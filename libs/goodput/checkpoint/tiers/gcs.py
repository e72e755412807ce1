"""Google Cloud Storage tier through ``google-cloud-storage``.

Large files move in parallel parts: downloads as concurrent ranged reads
(``transfer_manager.download_chunks_concurrently``), uploads as concurrent part objects
joined server-side with ``compose`` — XML multipart uploads (``upload_chunks_concurrently``)
are not served by fake-gcs-server, compose is, and both exist on real GCS. Every object
carries its xxh3_128 in its metadata and downloads are verified against it.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, TypeVar

import requests
from google.api_core import exceptions as gapi_exceptions
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage import transfer_manager
from google.cloud.storage.retry import DEFAULT_RETRY

from goodput.checkpoint.format import file_xxh3_128
from goodput.checkpoint.tiers.object_store import (
    CHECKSUM_METADATA_KEY,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreUnavailable,
    download_verified,
    validate_key,
)

MAX_COMPOSE_SOURCES = 32  # GCS limit per compose request
PARTS_PREFIX = "_parts/"
UPLOAD_BUFFER_BYTES = 8 << 20

T = TypeVar("T")

_UNAVAILABLE = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    auth_exceptions.TransportError,
    gapi_exceptions.RetryError,
    gapi_exceptions.ServiceUnavailable,
    gapi_exceptions.GatewayTimeout,
    ConnectionError,
)


class FileRange(io.RawIOBase):
    """A byte range of an open file as a stream starting at 0: resumable uploads insist on
    a stream positioned at its beginning, and parts must not be copied into memory."""

    def __init__(self, file: BinaryIO, start: int, length: int) -> None:
        super().__init__()
        self._file = file
        self._start = start
        self._length = length
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._length}[whence]
        self._position = min(max(0, base + offset), self._length)
        return self._position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]  # io's stub: any buffer; only io.BufferedReader reads this, with a memoryview
        want = min(len(buffer), self._length - self._position)
        if want <= 0:
            return 0
        n = os.preadv(
            self._file.fileno(), [memoryview(buffer)[:want]], self._start + self._position
        )
        self._position += n
        return n


def gcs_client(endpoint: str = "") -> storage.Client:
    """A client of real GCS (Application Default Credentials), or of the emulator at
    ``endpoint``: anonymous, so no credential is ever sent to an endpoint a URI named."""
    if not endpoint:
        return storage.Client()
    return storage.Client(
        project="goodput-local",
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=endpoint),
    )


class GcsObjectStore:
    """A bucket as an :class:`~goodput.checkpoint.tiers.object_store.ObjectStore`.

    ``retry_timeout_s`` bounds how long transient failures are retried before
    :class:`ObjectStoreUnavailable` is raised, so a caller learns quickly that the store is
    down and can fall back or retry later.
    """

    def __init__(
        self,
        bucket: str,
        client: storage.Client | None = None,
        *,
        part_bytes: int = 64 << 20,
        max_workers: int = 4,
        retry_timeout_s: float = 30.0,
    ) -> None:
        self.client = client or storage.Client()  # default: Application Default Credentials
        self.bucket = self.client.bucket(bucket)
        self.part_bytes = part_bytes
        self.max_workers = max_workers
        self.retry = DEFAULT_RETRY.with_timeout(retry_timeout_s)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except gapi_exceptions.NotFound as exc:
            raise ObjectNotFound(what) from exc
        except _UNAVAILABLE as exc:
            raise ObjectStoreUnavailable(
                f"object store gs://{self.bucket.name} unreachable during {what}: {exc}"
            ) from exc

    def put_file(self, key: str, path: Path, xxh3_128: str | None = None) -> None:
        validate_key(key)
        path = Path(path)
        digest = xxh3_128 or file_xxh3_128(path)
        size = path.stat().st_size
        if size <= self.part_bytes or self.max_workers <= 1:
            blob = self.bucket.blob(key)
            blob.metadata = {CHECKSUM_METADATA_KEY: digest}
            self._call(f"upload {key}", lambda: blob.upload_from_filename(path, retry=self.retry))
            return
        self._call(f"upload {key}", lambda: self._put_in_parts(key, path, size, digest))

    def _put_in_parts(self, key: str, path: Path, size: int, digest: str) -> None:
        part_bytes = max(self.part_bytes, math.ceil(size / MAX_COMPOSE_SOURCES))
        upload_id = uuid.uuid4().hex
        ranges = [(start, min(part_bytes, size - start)) for start in range(0, size, part_bytes)]
        parts = [self.bucket.blob(f"{PARTS_PREFIX}{upload_id}/{i:05d}") for i in range(len(ranges))]

        def upload_part(index: int) -> None:
            start, length = ranges[index]
            with open(path, "rb") as f:
                parts[index].upload_from_file(
                    io.BufferedReader(FileRange(f, start, length), UPLOAD_BUFFER_BYTES),
                    size=length,
                    retry=self.retry,
                )

        try:
            with ThreadPoolExecutor(self.max_workers) as pool:
                list(pool.map(upload_part, range(len(ranges))))
            destination = self.bucket.blob(key)
            destination.metadata = {CHECKSUM_METADATA_KEY: digest}
            destination.compose(parts, retry=self.retry)
        finally:
            # One attempt each: if the store just went away, leftover parts under
            # PARTS_PREFIX are garbage for a sweep, not a reason to block for minutes.
            for part in parts:
                with contextlib.suppress(gapi_exceptions.GoogleAPIError, *_UNAVAILABLE):
                    part.delete(retry=None, timeout=5)

    def get_file(self, key: str, dest: Path, xxh3_128: str | None = None) -> None:
        validate_key(key)
        blob = self._call(f"stat {key}", lambda: self.bucket.get_blob(key, retry=self.retry))
        if blob is None:
            raise ObjectNotFound(key)
        expected = xxh3_128 or (blob.metadata or {}).get(CHECKSUM_METADATA_KEY)

        def download(temp: Path) -> None:
            if blob.size > self.part_bytes and self.max_workers > 1:
                self._call(
                    f"download {key}",
                    lambda: transfer_manager.download_chunks_concurrently(
                        blob,
                        str(temp),
                        chunk_size=self.part_bytes,
                        download_kwargs={"retry": self.retry},
                        worker_type=transfer_manager.THREAD,
                        max_workers=self.max_workers,
                        crc32c_checksum=False,
                    ),
                )
            else:
                self._call(
                    f"download {key}",
                    lambda: blob.download_to_filename(str(temp), retry=self.retry),
                )

        download_verified(key, dest, expected, download)

    def put_bytes(self, key: str, data: bytes) -> None:
        blob = self.bucket.blob(validate_key(key))
        self._call(f"upload {key}", lambda: blob.upload_from_string(data, retry=self.retry))

    def get_bytes(self, key: str) -> bytes:
        blob = self.bucket.blob(validate_key(key))
        return self._call(f"download {key}", lambda: blob.download_as_bytes(retry=self.retry))

    def stat(self, key: str) -> ObjectInfo | None:
        blob = self._call(
            f"stat {key}", lambda: self.bucket.get_blob(validate_key(key), retry=self.retry)
        )
        if blob is None:
            return None
        return ObjectInfo(key, blob.size, (blob.metadata or {}).get(CHECKSUM_METADATA_KEY))

    def list(self, prefix: str) -> Iterator[str]:
        def names() -> list[str]:
            return [
                b.name
                for b in self.client.list_blobs(self.bucket, prefix=prefix, retry=self.retry)
                if not b.name.startswith(PARTS_PREFIX)
            ]

        yield from self._call(f"list {prefix!r}", names)

    def delete(self, key: str) -> None:
        blob = self.bucket.blob(validate_key(key))
        with contextlib.suppress(ObjectNotFound):
            self._call(f"delete {key}", lambda: blob.delete(retry=self.retry))
