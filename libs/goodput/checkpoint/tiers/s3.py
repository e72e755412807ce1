"""Amazon S3 tier, and S3-compatible stores (MinIO, Ceph RGW), through ``boto3``.

``boto3`` is goodput's ``s3`` extra, imported only when an ``s3://`` store is opened
(:mod:`goodput.checkpoint.tiers.open_store`). It was chosen over ``obstore`` because it asks
the whole standard credential chain users already configure — environment, the shared
``~/.aws`` config and credentials files (profiles, SSO, assume-role), web identity (EKS
IRSA), container and instance roles — where obstore's native chain reads no profile files;
it is pure Python (any platform the services run on), its S3 emulator (moto) is built on it,
and AWS keeps it.

Large files move as multipart uploads and concurrent ranged downloads (boto3's transfer
manager). An object appears only when its upload completes (one PUT, or the
CompleteMultipartUpload that joins its parts), so a reader sees the whole object or none; a
failed multipart upload is aborted. Every object carries its xxh3_128 in its user metadata
and every download is verified against it, or against the digest the caller expects.

With ``endpoint=`` the same credential chain is asked (MinIO and Ceph RGW want keys of their
own: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, or ``AWS_PROFILE`` naming a profile
in the shared files). Requests are signed (SigV4): the secret key never crosses the wire.
Buckets are addressed by path (no per-bucket DNS name), and transport checksums are sent
only where an operation requires them: not every S3-compatible store accepts the CRC
trailers boto3 sends AWS by default, and the xxh3_128 check covers the bytes end to end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import boto3
import xxhash
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from s3transfer.exceptions import RetriesExceededError
from s3transfer.subscribers import BaseSubscriber

from goodput.checkpoint.format import ChecksumMismatch, file_xxh3_128
from goodput.checkpoint.tiers.object_store import (
    CHECKSUM_METADATA_KEY,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreUnavailable,
    download_verified,
    validate_key,
)

T = TypeVar("T")

#: S3's error codes for a key that is not there (HEAD answers with the bare status)
_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
#: codes of a store that is overloaded or slow, not refusing: retried like an outage
_TRANSIENT = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout"})
#: attempts botocore makes inside one call (standard mode: backoff with jitter, throttles too)
CALL_ATTEMPTS = 3
CREDENTIALS_HINT = (
    "credentials come from boto3's chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
    "AWS_PROFILE and ~/.aws, or a web-identity, container or instance role"
)


def s3_client(endpoint: str = "", region: str = "") -> Any:
    """A client of AWS S3, or of the S3-compatible store at ``endpoint``; credentials and
    (without ``region``) the region from boto3's standard chain."""
    checksums = "when_required" if endpoint else "when_supported"
    config = Config(
        retries={"mode": "standard", "max_attempts": CALL_ATTEMPTS},
        connect_timeout=5,
        read_timeout=60,
        request_checksum_calculation=checksums,
        response_checksum_validation=checksums,
        **({"s3": {"addressing_style": "path"}} if endpoint else {}),
    )
    # a session of its own: boto3's default session is process-wide state
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint or None, region_name=region or None, config=config
    )


class _KnownSize(BaseSubscriber):
    """Tells the transfer manager an object's size, which a stat just read: it would
    otherwise send a HEAD of its own before each download."""

    def __init__(self, size: int) -> None:
        self.size = size

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self.size)


class S3ObjectStore:
    """A bucket as an :class:`~goodput.checkpoint.tiers.object_store.ObjectStore`.

    ``retry_timeout_s`` bounds (roughly: each call's own attempts come on top) how long an
    unreachable or overloaded store is retried before :class:`ObjectStoreUnavailable` is
    raised; a refusal (credentials, permissions, a missing bucket) is raised at once. Both
    are one line naming the store and the operation.
    """

    def __init__(
        self,
        bucket: str,
        client: Any,
        *,
        part_bytes: int = 64 << 20,
        max_workers: int = 4,
        retry_timeout_s: float = 30.0,
        page_keys: int = 1000,
    ) -> None:
        self.bucket = bucket
        self.client = client
        self.retry_timeout_s = retry_timeout_s
        self.page_keys = page_keys
        # S3 takes parts of 5 MiB and more, at most 10,000: the manager raises the part
        # size to fit both, so a 64 MiB part size covers objects up to 640 GB as is
        self.transfer = TransferConfig(
            multipart_threshold=part_bytes,
            multipart_chunksize=part_bytes,
            max_concurrency=max_workers,
            use_threads=max_workers > 1,
            preferred_transfer_client="classic",
        )

    def _manager(self) -> AbstractContextManager[Any]:
        manager: AbstractContextManager[Any] = create_transfer_manager(self.client, self.transfer)
        return manager

    def _call(self, what: str, fn: Callable[[], T], key: str = "") -> T:
        deadline = time.monotonic() + self.retry_timeout_s
        delay = 0.2
        while True:
            try:
                return fn()
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code in _NOT_FOUND and key:
                    raise ObjectNotFound(key) from exc
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
                transient, failure = status >= 500 or code in _TRANSIENT, exc
            except (BotoConnectionError, RetriesExceededError) as exc:
                # refused, timed out, reset; or a download's body cut off on every attempt
                transient, failure = True, exc
            except BotoCoreError as exc:  # no credentials, a bad configuration
                transient, failure = False, exc
            if not transient or time.monotonic() + delay > deadline:
                raise self._error(what, failure, transient) from failure
            time.sleep(delay)
            delay = min(2 * delay, 2.0)

    def _error(self, what: str, exc: Exception, transient: bool) -> ObjectStoreUnavailable:
        how = "unreachable" if transient else "refused"
        reason = " ".join(str(exc).split())
        hint = f" ({CREDENTIALS_HINT})" if "credentials" in reason.lower() else ""
        return ObjectStoreUnavailable(
            f"object store s3://{self.bucket} {how} during {what}: {reason}{hint}"
        )

    def put_file(self, key: str, path: Path, xxh3_128: str | None = None) -> None:
        validate_key(key)
        path = Path(path)
        digest = xxh3_128 or file_xxh3_128(path)

        def upload() -> None:
            with self._manager() as manager:
                metadata = {"Metadata": {CHECKSUM_METADATA_KEY: digest}}
                manager.upload(str(path), self.bucket, key, extra_args=metadata).result()

        self._call(f"upload {key}", upload)

    def get_file(self, key: str, dest: Path, xxh3_128: str | None = None) -> None:
        info = self.stat(key)
        if info is None:
            raise ObjectNotFound(key)
        expected = xxh3_128 or info.xxh3_128

        def download(temp: Path) -> None:
            with self._manager() as manager:
                sized = [_KnownSize(info.size)]
                manager.download(self.bucket, key, str(temp), subscribers=sized).result()

        download_verified(
            key,
            dest,
            expected,
            lambda temp: self._call(f"download {key}", partial(download, temp), key),
        )

    def put_bytes(self, key: str, data: bytes) -> None:
        validate_key(key)
        metadata = {CHECKSUM_METADATA_KEY: xxhash.xxh3_128_hexdigest(data)}
        self._call(
            f"upload {key}",
            lambda: self.client.put_object(
                Bucket=self.bucket, Key=key, Body=data, Metadata=metadata
            ),
        )

    def get_bytes(self, key: str) -> bytes:
        validate_key(key)

        def read() -> tuple[bytes, str | None]:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            return response["Body"].read(), response.get("Metadata", {}).get(CHECKSUM_METADATA_KEY)

        data, expected = self._call(f"download {key}", read, key)
        actual = xxhash.xxh3_128_hexdigest(data)
        if expected is not None and actual != expected:
            raise ChecksumMismatch(f"object {key}: xxh3_128 {actual}, expected {expected}")
        return data

    def stat(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        try:
            head = self._call(
                f"stat {key}", lambda: self.client.head_object(Bucket=self.bucket, Key=key), key
            )
        except ObjectNotFound:
            return None
        checksum = head.get("Metadata", {}).get(CHECKSUM_METADATA_KEY)
        return ObjectInfo(key, int(head["ContentLength"]), checksum)

    def list(self, prefix: str) -> Iterator[str]:
        """The keys under ``prefix``, a page (``page_keys``) at a time, as the store sends them."""
        request: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        while True:
            page = self._call(f"list {prefix!r}", partial(self._page, request))
            for item in page.get("Contents", ()):
                yield item["Key"]
            if not page.get("IsTruncated"):
                return
            request = {**request, "ContinuationToken": page["NextContinuationToken"]}

    def _page(self, request: dict[str, Any]) -> dict[str, Any]:
        page: dict[str, Any] = self.client.list_objects_v2(**request, MaxKeys=self.page_keys)
        return page

    def delete(self, key: str) -> None:
        validate_key(key)  # deleting a key that is not there succeeds, as S3 answers it
        self._call(f"delete {key}", lambda: self.client.delete_object(Bucket=self.bucket, Key=key))
