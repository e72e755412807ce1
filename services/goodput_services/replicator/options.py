"""The replicator's options (``--set key=value``), checked at start-up.

Unknown keys are an error, so a typo in a retention setting cannot silently keep (or
delete) checkpoints the operator did not mean to.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from goodput.checkpoint.index.index import DEFAULT_NODE_TTL_S, REFRESHES_PER_TTL
from goodput.checkpoint.index.retention import DEFAULT_KEEP, DEFAULT_REQUIRE
from goodput.checkpoint.tiers.store_uri import (
    LEGACY_ENDPOINT_KEY,
    StoreUri,
    StoreUriError,
    parse_store_uri,
)
from goodput.schemas.tiers import LOCAL, OBJECT_STORE, PEER, StorageTier
from goodput.state_dir import StateDir


class ReplicatorOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: the store URI (``checkpoint.tiers.store_uri``): "file:///<path>",
    #: "gs://<bucket>[/<prefix>][?endpoint=<emulator url>]" or
    #: "s3://<bucket>[/<prefix>][?endpoint=<url>][&region=<r>]"; the spellings "dir:<path>" and
    #: "gcs:<bucket>" of earlier releases still work. Empty: ``<state_dir>/object-store``
    object_store: str = ""
    #: refuse an object store on this node's own disk (the default, or a "file://" inside the
    #: state directory): it would die with the node it is meant to outlive. The Kubernetes
    #: configuration sets it, where the state directory is the node's hostPath
    require_off_node_store: bool = False
    #: earlier releases' separate emulator setting of a "gcs:" store, folded into the URI
    legacy_endpoint: str = msgspec.field(default="", name=LEGACY_ENDPOINT_KEY)
    #: how long a GCS call retries before the store counts as unavailable
    store_retry_s: float = 20.0
    #: topology of this node, e.g. {block = "b0", rack = "r1"}
    labels: dict[str, str] = {}
    #: the label whose equality makes a peer "close" (same failure domain)
    block_label: str = "block"
    #: address the peer data plane listens on (loopback by default, like the embedded bus;
    #: "0.0.0.0" or "::" for every interface), and the address peers are told to reach it at
    #: (default: $GOODPUT_ADVERTISE_HOST, else ``host``: ``checkpoint.tiers.peer.address``)
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
    #: polling period of the node's disk (the node is announced only when its record is due:
    #: ``checkpoint.index.announcement``)
    poll_s: float = 1.0
    #: a node whose announcement is older than this holds nothing, as far as the index is
    #: concerned; an unchanged announcement is refreshed every third of it. The backstop for
    #: a node that dies unseen: an orderly stop, and the supervisor counting a node failed,
    #: withdraw its record at once
    node_ttl_s: float = DEFAULT_NODE_TTL_S
    #: a peer that failed a copy is not chosen again for this long
    peer_cooldown_s: float = 15.0
    #: held copies are fully re-hashed this often (bit rot, tampering)
    scrub_interval_s: float = 600.0
    #: the behaviour before event-driven replication, kept as the benchmark's baseline:
    #: find new checkpoints by polling only (no watch of the volume, no wake-up by the peer
    #: server's commits) and hash every new copy in full, instead of trusting the engine's
    #: seal and the peer's receive check
    legacy_scan: bool = False
    #: retention: complete checkpoints kept per tier, and the tiers a newer checkpoint must be
    #: complete in before anything older is deleted anywhere. ``keep_local`` is the node
    #: volume's one count: published in its retention record, the ranks' engine keeps as many
    keep_local: int = DEFAULT_KEEP[LOCAL]
    keep_peer: int = DEFAULT_KEEP[PEER]
    keep_object_store: int = DEFAULT_KEEP[OBJECT_STORE]
    gc_require: list[StorageTier] = msgspec.field(default_factory=lambda: list(DEFAULT_REQUIRE))
    gc_interval_s: float = 30.0

    @classmethod
    def from_mapping(cls, options: dict) -> ReplicatorOptions:
        try:
            parsed = msgspec.convert(options, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise SystemExit(f"invalid replicator option: {exc}") from exc
        if parsed.poll_s <= 0 or parsed.node_ttl_s < REFRESHES_PER_TTL * parsed.poll_s:
            raise SystemExit(
                f"node_ttl_s ({parsed.node_ttl_s:g}) must be at least {REFRESHES_PER_TTL} x "
                f"poll_s ({parsed.poll_s:g}) > 0: the announcement is refreshed every "
                f"1/{REFRESHES_PER_TTL} of the TTL, checked every poll"
            )
        if min(parsed.keep_local, parsed.keep_peer, parsed.keep_object_store) < 1:
            raise SystemExit("keep_local, keep_peer and keep_object_store must be at least 1")
        if parsed.object_store or parsed.legacy_endpoint:
            try:
                parse_store_uri(parsed.object_store, parsed.legacy_endpoint)
            except StoreUriError as exc:
                raise SystemExit(f"invalid replicator option: {exc}") from None
        return parsed


def store_uri(options: ReplicatorOptions, state_dir: Path) -> StoreUri:
    """The object store's URI; refused (one line) when it must be off the node and is not."""
    state = Path(state_dir).resolve()
    try:
        uri = (
            parse_store_uri(options.object_store, options.legacy_endpoint)
            if options.object_store
            else StoreUri("file", str(StateDir(state).object_store))
        )
    except StoreUriError as exc:
        raise SystemExit(f"invalid replicator option: {exc}") from None
    if (
        options.require_off_node_store
        and uri.scheme == "file"
        and Path(uri.where).resolve().is_relative_to(state)
    ):
        raise SystemExit(
            f"object store {uri} is on this node's disk (inside the state directory {state}) "
            'and would die with the node: set object_store = "gs://<bucket>" or "s3://<bucket>" '
            "(or a file:// on a shared volume) under [services.replicator]"
        )
    return uri
