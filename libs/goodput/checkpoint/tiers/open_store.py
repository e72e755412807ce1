"""The object store a store URI names: the one place that turns a URI into a client.

Google Cloud Storage's client library is imported only when a ``gs://`` store is opened,
so a directory store (the embedded default) starts without it.
"""

from __future__ import annotations

from pathlib import Path

from goodput.checkpoint.tiers.object_store import DirectoryObjectStore, ObjectStore, PrefixedStore
from goodput.checkpoint.tiers.store_uri import StoreUri, parse_store_uri


def open_object_store(uri: StoreUri | str, retry_s: float = 20.0) -> ObjectStore:
    """The store at ``uri``; ``retry_s`` bounds how long a remote store's calls retry.

    Raises :class:`~goodput.checkpoint.tiers.store_uri.StoreUriError` for a URI this build
    cannot use: callers at the user's edge turn it into one line.
    """
    where = uri if isinstance(uri, StoreUri) else parse_store_uri(uri)
    if where.scheme == "file":
        return DirectoryObjectStore(Path(where.where))
    from goodput.checkpoint.tiers.gcs import GcsObjectStore, gcs_client

    store = GcsObjectStore(where.where, gcs_client(where.endpoint), retry_timeout_s=retry_s)
    return PrefixedStore(store, where.prefix) if where.prefix else store
