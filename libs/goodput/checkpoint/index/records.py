"""What the replicators keep in the ``gp_ckpt_index`` KV bucket (keys prefixed ``<job>.``).

- ``<job>.node.<node>``: the node's peer data-plane address, topology labels and object store,
  written on change and refreshed every few minutes (``index/announcement.py``); deleted when
  the node stops in order or the supervisor counts it failed. An absent or stale one means
  the node is gone and holds nothing.
- ``<job>.copy.<step>.<tier>.<holder>.<owner>``: one verified copy of ``owner``'s checkpoint
  ``step`` on ``tier`` — in ``holder``'s volume (``local``), in ``holder``'s peer area
  (``peer``), or in the object store (``object_store``, holder ``store``) — with the checksum
  of every file. A copy is published only after its files were hashed and matched. A copy of
  one **part** of a checkpoint sharded across nodes (``goodput.checkpoint.format.parts``) also
  names its part, the part count and the commit id its manifest carries; ``parts`` 0 is a
  whole checkpoint.

Records are versioned like the bus messages: a record of a newer schema than this build
understands is refused rather than half-read. Schema 2: copy records of parts (``part``,
``parts``, ``commit``); a build of schema 1 would count a part as a whole checkpoint, so it
must refuse them. The node record's ``object_store`` holds a store URI since schema 2 too,
without a new version: a build of either spelling decodes the other's records (the legacy
endpoint field stays declared), the spellings of before are read as aliases, and the only
reader, ``goodput ckpt``, of an older build refuses a URI in one line rather than misreading it.
"""

from __future__ import annotations

from typing import TypedDict, TypeVar

import msgspec

from goodput import subjects
from goodput.checkpoint.format.parts import MAX_PARTS, PartOf
from goodput.checkpoint.tiers.store_uri import LEGACY_ENDPOINT_KEY, StoreUri, parse_store_uri
from goodput.schemas.tiers import StorageTier

INDEX_SCHEMA_VERSION = 2
STORE_HOLDER = "store"


class IndexRecordError(ValueError):
    """An index entry that is not a valid record this build understands."""


class FileRef(msgspec.Struct, frozen=True, array_like=True):
    name: str
    size: int
    xxh3_128: str


class NodeAddressRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node: str
    host: str
    port: int
    labels: dict[str, str] = {}
    #: the URI of the object store this node backs up to (``checkpoint.tiers.store_uri``).
    #: Read from the bus, so possibly forged: :meth:`store` only parses it; which store a
    #: reader follows is the reader's rule (``goodput ckpt``: one all live nodes agree on)
    object_store: str = ""
    #: schema 2 and before: the emulator endpoint of a "gcs:" store, kept beside it; now in
    #: the URI. Still declared so that records of either build decode in the other
    legacy_endpoint: str = msgspec.field(default="", name=LEGACY_ENDPOINT_KEY)
    #: epoch ns of the write (a change or a refresh): what the node TTL reads
    ts: int = 0
    schema: int = INDEX_SCHEMA_VERSION

    def store(self) -> StoreUri | None:
        """The announced store, None when none is; :class:`StoreUriError` when unusable."""
        if not self.object_store:
            return None
        return parse_store_uri(self.object_store, self.legacy_endpoint)


class CopyRecord(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    step: int
    tier: StorageTier
    holder: str
    owner: str
    #: where the checkpoint's step directory lives: relative to the holder's peer root
    #: (local, peer tiers) or the listing namespace in the object store
    root: str
    files: list[FileRef]
    verified_ts: int = 0
    #: which part of a sharded checkpoint across nodes this copy holds (0..parts-1), of how
    #: many, and the commit id every part of it carries; ``parts`` 0: a whole checkpoint
    part: int = 0
    parts: int = 0
    commit: str = ""
    schema: int = INDEX_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.parts < 0 or self.parts > MAX_PARTS or not 0 <= self.part < max(self.parts, 1):
            raise ValueError(f"part {self.part} of {self.parts}")
        if bool(self.parts) != bool(self.commit):
            raise ValueError("a part names its commit, a whole checkpoint none")

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def is_part(self) -> bool:
        return self.parts > 0

    @property
    def part_key(self) -> tuple[str, int] | None:
        """(commit, part) for a part, None for a whole checkpoint: copies are only ever
        matched against copies of the same part."""
        return (self.commit, self.part) if self.parts else None

    def checksums(self) -> frozenset[tuple[str, int, str]]:
        return frozenset((f.name, f.size, f.xxh3_128) for f in self.files)

    def same_data(self, other: CopyRecord) -> bool:
        """Whether ``other`` holds exactly these files of the same checkpoint or part (what
        lets a peer verify and link instead of receiving): a part never matches another part."""
        return self.part_key == other.part_key and self.checksums() == other.checksums()


class PartFields(TypedDict, total=False):
    """A sharded checkpoint's part fields of a :class:`CopyRecord`."""

    part: int
    parts: int
    commit: str


def part_fields(part: PartOf | msgspec.UnsetType) -> PartFields:
    """The copy record fields of a manifest's ``part`` (none for a whole checkpoint)."""
    if isinstance(part, PartOf):
        return PartFields(part=part.part, parts=part.count, commit=part.commit)
    return PartFields()


def node_key(job: str, node: str) -> str:
    return subjects.kv_key(job, "node", node)


def copy_key(job: str, record: CopyRecord) -> str:
    return subjects.kv_key(
        job, "copy", f"{record.step:010d}", record.tier, record.holder, record.owner
    )


def key_kind(key: str) -> str:
    """ "node" or "copy" for a key of this bucket (what to decode the value as)."""
    parts = key.split(".")
    return parts[1] if len(parts) > 1 else ""


def store_namespace(job: str, owner: str) -> str:
    """Where ``owner``'s backups of ``job`` are listed in the object store."""
    return f"{job}/{owner}"


_encoder = msgspec.msgpack.Encoder()
_node_decoder = msgspec.msgpack.Decoder(NodeAddressRecord)
_copy_decoder = msgspec.msgpack.Decoder(CopyRecord)


def encode(record: NodeAddressRecord | CopyRecord) -> bytes:
    return _encoder.encode(record)


R = TypeVar("R", NodeAddressRecord, CopyRecord)


def _checked(record: R) -> R:
    if record.schema > INDEX_SCHEMA_VERSION:
        raise IndexRecordError(
            f"index record schema {record.schema} is newer than this build understands "
            f"({INDEX_SCHEMA_VERSION}); upgrade goodput"
        )
    return record


def decode_node(data: bytes) -> NodeAddressRecord:
    try:
        record = _node_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise IndexRecordError(f"invalid node record: {exc}") from exc
    return _checked(record)


def decode_copy(data: bytes) -> CopyRecord:
    try:
        record = _copy_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise IndexRecordError(f"invalid copy record: {exc}") from exc
    return _checked(record)
