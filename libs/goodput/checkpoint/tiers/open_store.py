"""The object store a store URI names: the one place that turns a URI into a client.

A remote store's client library is imported only when a store of its scheme is opened, so
a directory store (the embedded default) starts without either; S3's (``boto3``) is an
extra, and a URI that needs it where it is not installed is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from goodput.checkpoint.tiers.object_store import DirectoryObjectStore, ObjectStore, PrefixedStore
from goodput.checkpoint.tiers.store_uri import StoreUri, StoreUriError, parse_store_uri

#: the packages of goodput's ``s3`` extra
S3_EXTRA_MODULES = frozenset({"boto3", "botocore", "s3transfer"})


def open_object_store(uri: StoreUri | str, retry_s: float = 20.0) -> ObjectStore:
    """The store at ``uri``; ``retry_s`` bounds how long a remote store's calls retry.

    Raises :class:`~goodput.checkpoint.tiers.store_uri.StoreUriError` for a URI this build
    cannot use: callers at the user's edge turn it into one line.
    """
    where = uri if isinstance(uri, StoreUri) else parse_store_uri(uri)
    store: ObjectStore
    if where.scheme == "file":
        return DirectoryObjectStore(Path(where.where))
    if where.scheme == "s3":
        try:
            from goodput.checkpoint.tiers.s3 import S3ObjectStore, s3_client
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] not in S3_EXTRA_MODULES:
                raise
            raise StoreUriError(
                f"object store {str(where)!r}: S3 needs goodput's s3 extra, not installed "
                "here (pip install 'goodput[s3]')"
            ) from None
        client = s3_client(where.endpoint, where.region)
        store = S3ObjectStore(where.where, client, retry_timeout_s=retry_s)
    else:
        from goodput.checkpoint.tiers.gcs import GcsObjectStore, gcs_client

        store = GcsObjectStore(where.where, gcs_client(where.endpoint), retry_timeout_s=retry_s)
    return PrefixedStore(store, where.prefix) if where.prefix else store
