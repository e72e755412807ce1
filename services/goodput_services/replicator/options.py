"""The replicator's options (``--set key=value``), checked at start-up, and its object store.

Unknown keys are an error, so a typo in a retention setting cannot silently keep (or
delete) checkpoints the operator did not mean to.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from goodput.tiers.object_store import DirectoryObjectStore, ObjectStore


class ReplicatorOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: "dir:<path>" or "gcs:<bucket>"; empty: ``<state_dir>/object-store``
    object_store: str = ""
    #: fake-gcs-server (or other emulator) URL for "gcs:" stores; empty: real GCS
    gcs_endpoint: str = ""
    #: how long a GCS call retries before the store counts as unavailable
    store_retry_s: float = 20.0
    #: topology of this node, e.g. {block = "b0", rack = "r1"}
    labels: dict[str, str] = {}
    #: the label whose equality makes a peer "close" (same failure domain)
    block_label: str = "block"
    #: address the peer data plane listens on (loopback by default, like the embedded bus),
    #: and the address peers are told to reach it at (default: ``host``)
    host: str = "127.0.0.1"
    port: int = 0
    advertise_host: str = ""
    #: peers each checkpoint is replicated to (at least one close and one distant when possible)
    replicas: int = 2
    #: how long a new checkpoint waits for peers with identical data to show up before it is
    #: sent to peers that need a real copy
    dedup_wait_s: float = 10.0
    #: back up every k-th checkpoint, or when this many seconds passed since the last backup
    backup_every: int = 5
    backup_interval_s: float = 600.0
    #: how long a node waits for the node that leads its identical-data group to back up first
    backup_wait_s: float = 30.0
    #: a push that takes longer is abandoned (and resumed on the next attempt)
    push_timeout_s: float = 300.0
    #: polling period of the node's disk; the node is announced in the index as often
    poll_s: float = 1.0
    #: a node whose announcement is older than this holds nothing, as far as the index is concerned
    node_ttl_s: float = 15.0
    #: held copies are fully re-hashed this often (bit rot, tampering)
    scrub_interval_s: float = 600.0
    #: retention: complete checkpoints kept per tier, and the tiers a newer checkpoint must be
    #: complete in before anything older is deleted anywhere
    keep_local: int = 2
    keep_peer: int = 2
    keep_object_store: int = 3
    gc_require: list[str] = msgspec.field(default_factory=lambda: ["peer"])
    gc_interval_s: float = 30.0

    @classmethod
    def from_mapping(cls, options: dict) -> ReplicatorOptions:
        try:
            parsed = msgspec.convert(options, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise SystemExit(f"invalid replicator option: {exc}") from exc
        unknown = set(parsed.gc_require) - {"local", "peer", "object_store"}
        if unknown:
            raise SystemExit(f"invalid gc_require tiers {sorted(unknown)}")
        if min(parsed.keep_local, parsed.keep_peer, parsed.keep_object_store) < 1:
            raise SystemExit("keep_local, keep_peer and keep_object_store must be at least 1")
        return parsed


def store_spec(options: ReplicatorOptions, state_dir: Path) -> str:
    return options.object_store or f"dir:{Path(state_dir).resolve() / 'object-store'}"


def open_object_store(spec: str, gcs_endpoint: str = "", retry_s: float = 20.0) -> ObjectStore:
    """The store named by ``spec``: ``dir:<path>`` or ``gcs:<bucket>`` (optionally an emulator)."""
    kind, _, where = spec.partition(":")
    if kind == "dir" and where:
        return DirectoryObjectStore(Path(where))
    if kind == "gcs" and where:
        from goodput.tiers.gcs import GcsObjectStore

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
