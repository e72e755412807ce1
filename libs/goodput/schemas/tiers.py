"""The tier table: every place a checkpoint's bytes are kept or restored from, once, with
the properties the code asks of it.

A tier's wire name is spelled in the Literals below (mypy binds every producer to them);
everything else about a tier — whether the replicator stores and indexes copies there, whose
machine holds it, whether it outlives the node, how near a restore finds it, what a person
reads — is a column of :data:`TIERS`, which is checked against the Literals when this module
is imported. Code asks ``TIERS[copy.tier].on_node`` rather than comparing with a string, and
names one tier by its constant (:data:`LOCAL`, :data:`PEER`, …), so a misspelt tier is an
import error and a new tier is one row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, get_args

#: where the replicator keeps checkpoint copies and indexes them (``CopyRecord.tier``)
StorageTier = Literal["local", "peer", "object_store"]
#: where a restore read its bytes (``RestoreResult.tier``, ``CheckpointRestored.tier``): a
#: storage tier, the engine's host buffers after an in-process restart, or the directory
#: every node shares (``torch-save`` mode)
RestoreSource = Literal["host", "local", "shared", "peer", "object_store"]
#: what a restore reports (``CheckpointRestored.tier``): where it read, or that nothing was
#: there to restore (:data:`NOTHING_RESTORED`)
RestoredFrom = Literal[RestoreSource, "none"]
#: whose machine holds a tier: the node whose checkpoint it is, a filesystem every node
#: mounts, or another machine (a peer node, an object store)
Locality = Literal["own", "shared", "remote"]

HOST: Final = "host"
LOCAL: Final = "local"
SHARED: Final = "shared"
PEER: Final = "peer"
OBJECT_STORE: Final = "object_store"
NOTHING_RESTORED: Final = "none"


@dataclass(frozen=True)
class Tier:
    """One tier's properties."""

    #: the wire name (a value of :data:`RestoreSource`)
    name: RestoreSource
    #: what a person reads
    title: str
    #: restore order: a smaller number is nearer (read first, and cheaper to read)
    nearness: int
    #: the replicator stores, indexes and garbage-collects copies here (a :data:`StorageTier`)
    stored: bool
    locality: Locality
    #: a node (its memory or its disk) holds the bytes: they count while that node is alive
    #: and go with it; False for a store or filesystem outside the nodes
    on_node: bool

    @property
    def survives_node(self) -> bool:
        """The bytes outlive the loss of the node whose checkpoint they are (a node new to
        the job can restore from here)."""
        return self.locality != "own"


#: every tier, nearest first (read-only)
TIERS: Final[Mapping[RestoreSource, Tier]] = MappingProxyType(
    {
        tier.name: tier
        for tier in (
            Tier(
                name=HOST,
                title="host memory",
                nearness=0,
                stored=False,
                locality="own",
                on_node=True,
            ),
            Tier(
                name=LOCAL,
                title="local volume",
                nearness=1,
                stored=True,
                locality="own",
                on_node=True,
            ),
            Tier(
                name=SHARED,
                title="shared filesystem",
                nearness=2,
                stored=False,
                locality="shared",
                on_node=False,
            ),
            Tier(
                name=PEER,
                title="peer",
                nearness=3,
                stored=True,
                locality="remote",
                on_node=True,
            ),
            Tier(
                name=OBJECT_STORE,
                title="object store",
                nearness=4,
                stored=True,
                locality="remote",
                on_node=False,
            ),
        )
    }
)

#: the storage tiers, nearest first
STORAGE_TIERS: Final[tuple[StorageTier, ...]] = get_args(StorageTier)


def check_table(table: Mapping[RestoreSource, Tier]) -> None:
    """Raise unless ``table`` and the Literals name the same tiers, in the same order (nearest
    first), each once; run on :data:`TIERS` at import."""
    sources: tuple[str, ...] = get_args(RestoreSource)
    if list(table) != list(sources) or any(name != row.name for name, row in table.items()):
        raise TypeError(f"the tier table {list(table)} is not RestoreSource {list(sources)}")
    if [t.nearness for t in table.values()] != sorted({t.nearness for t in table.values()}):
        raise TypeError("the tier table is not listed nearest first, one tier per nearness")
    stored = tuple(name for name, tier in table.items() if tier.stored)
    if stored != STORAGE_TIERS:
        raise TypeError(f"the stored tiers {stored} are not StorageTier {STORAGE_TIERS}")


check_table(TIERS)
