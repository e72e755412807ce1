"""Where a restore reads a copy's files and its manifest from, nearest first.

The node's own volume, the copies it keeps for peers, live peers holding a copy (same block
first), then the object store; a manifest only from a copy whose files are the ones the index
names (and which the caller finds right: the part it asked for). Shared by the restore of a
whole checkpoint (:mod:`.restore`) and the staging of parts (:mod:`.restore_parts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from goodput.checkpoint.format import (
    Manifest,
    ManifestError,
    read_manifest,
    step_dir,
    step_dir_name,
)
from goodput.checkpoint.index.index import IndexSnapshot
from goodput.checkpoint.index.records import CopyRecord, FileRef
from goodput.checkpoint.tiers.backup import read_listing
from goodput.checkpoint.tiers.object_store import ObjectStore
from goodput.checkpoint.tiers.peer import PeerClient, PeerError
from goodput.checkpoint.tiers.restore import (
    FALLBACK_ERRORS,
    LocalSource,
    ObjectStoreSource,
    PeerSource,
    Source,
)
from goodput.schemas.tiers import PEER, TIERS
from goodput_services.replicator.topology import block_of


class NothingToRestore(LookupError):
    """The asked-for step is not complete in any tier, or no candidate could be restored."""


def copy_sources(
    snapshot: IndexSnapshot,
    copies: Sequence[CopyRecord],
    node: str,
    volume: Path,
    node_dir: Path,
    store: ObjectStore | None,
    block_label: str,
    prefer: Callable[[CopyRecord], bool] = lambda _: False,
) -> tuple[list[Source], list[PeerSource]]:
    """Sources for the files of ``copies``, nearest first: the node's volume, its own peer
    area, live peers holding a copy (same block first, then ``prefer`` False before True),
    the object store. Returns (sources, the peer sources to close afterwards)."""
    holders = [c for c in copies if c.holder != node and TIERS[c.tier].on_node]
    me = snapshot.nodes.get(node)
    my_block = block_of(me, block_label) if me else ""
    holders.sort(
        key=lambda c: (
            block_of(snapshot.nodes[c.holder], block_label) != my_block,
            prefer(c),
            c.holder,
        )
    )
    peers = [
        PeerSource(snapshot.nodes[c.holder].host, snapshot.nodes[c.holder].port, c.root)
        for c in holders
    ]
    locals_ = [LocalSource(volume)] + [
        LocalSource(node_dir / c.root) for c in copies if c.holder == node and c.tier == PEER
    ]
    sources: list[Source] = [*locals_, *peers]
    if store is not None:
        sources.append(ObjectStoreSource(store))
    return sources, peers


async def close_all(peers: Sequence[PeerSource]) -> None:
    await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)


async def find_manifest(
    copies: Sequence[CopyRecord],
    files: Sequence[FileRef],
    node: str,
    node_dir: Path,
    store: ObjectStore | None,
    snapshot: IndexSnapshot,
    accept: Callable[[Manifest], str] = lambda _: "",
) -> Manifest:
    """The manifest, verbatim, from the nearest of ``copies`` whose files match the index
    (and that ``accept`` finds nothing wrong with: it returns the problem, "" for none)."""
    wanted = {(f.name, f.size, f.xxh3_128) for f in files}
    ordered = sorted(copies, key=lambda c: (c.holder != node, TIERS[c.tier].nearness))
    problems = []
    for copy in ordered:
        where = f"manifest from {copy.tier}:{copy.holder}"
        try:
            manifest = await _read_manifest(copy, node, node_dir, store, snapshot)
        except (*FALLBACK_ERRORS, ManifestError) as exc:
            problems.append(f"{where}: {exc}")
            continue
        if {(f.name, f.size, f.xxh3_128) for f in manifest.files} != wanted:
            problems.append(f"{where} differs from the index")
        elif problem := accept(manifest):
            problems.append(f"{where}: {problem}")
        else:
            return manifest
    step = copies[0].step if copies else "?"
    raise NothingToRestore("; ".join(problems) or f"no manifest for step {step}")


async def _read_manifest(
    copy: CopyRecord, node: str, node_dir: Path, store: ObjectStore | None, snapshot: IndexSnapshot
) -> Manifest:
    if not TIERS[copy.tier].on_node:  # the object store's listing
        if store is None:
            raise PeerError("no object store configured")
        namespace = copy.root
        return await asyncio.to_thread(read_listing, store, namespace, copy.step)
    if copy.holder == node:
        return await asyncio.to_thread(read_manifest, step_dir(node_dir / copy.root, copy.step))
    holder = snapshot.nodes[copy.holder]
    async with await PeerClient.connect(holder.host, holder.port, timeout_s=5) as client:
        return await client.fetch_manifest(f"{copy.root}/{step_dir_name(copy.step)}")
