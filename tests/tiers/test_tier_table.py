"""The tier table (``goodput.schemas.tiers``): one row per wire name, the properties the code
asks of it, and the check that refuses a table out of step with the Literals."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pytest

from goodput import schemas
from goodput.checkpoint.index.retention import DEFAULT_KEEP, DEFAULT_REQUIRE
from goodput.schemas import tiers
from goodput.schemas.tiers import STORAGE_TIERS, TIERS, RestoredFrom, RestoreSource, StorageTier
from goodput.tools.cli.main import build_parser


def test_every_wire_name_has_exactly_one_row_nearest_first() -> None:
    sources = get_args(RestoreSource)
    assert list(TIERS) == list(sources) and len(set(sources)) == len(sources)
    assert all(name == row.name for name, row in TIERS.items())
    assert [row.nearness for row in TIERS.values()] == sorted(r.nearness for r in TIERS.values())
    assert STORAGE_TIERS == get_args(StorageTier) == ("local", "peer", "object_store")
    assert set(get_args(RestoredFrom)) == {*sources, "none"}


def test_the_properties_the_code_asks() -> None:
    stored = [name for name, row in TIERS.items() if row.stored]
    assert stored == list(STORAGE_TIERS)
    # a copy counts while its holder lives, and GC deletes it from that holder's disk
    assert [name for name, row in TIERS.items() if row.on_node] == ["host", "local", "peer"]
    # what a node new to the job can restore from (the simulator's fresh node)
    survive = [name for name, row in TIERS.items() if row.survives_node]
    assert survive == ["shared", "peer", "object_store"]
    # retention reads a holder's own clean record only for the holder's own volume
    assert [t for t in STORAGE_TIERS if TIERS[t].locality == "own"] == ["local"]
    # restore prefers the volume, then a peer, then the store; host memory before all
    order = sorted(TIERS, key=lambda name: TIERS[name].nearness)
    assert order.index("host") < order.index("local") < order.index("peer")
    assert order.index("peer") < order.index("object_store")
    assert len({row.title for row in TIERS.values()}) == len(TIERS)


def test_retention_and_the_cli_cover_every_storage_tier() -> None:
    assert list(DEFAULT_KEEP) == list(STORAGE_TIERS)
    assert set(DEFAULT_REQUIRE) <= set(STORAGE_TIERS)
    args = build_parser("ckpt").parse_args(["ckpt", "gc", "--keep-object-store", "7"])
    assert args.keep_local == DEFAULT_KEEP["local"] and args.keep_peer == DEFAULT_KEEP["peer"]
    assert args.keep_object_store == 7


@pytest.mark.parametrize("tier", [*get_args(RestoredFrom)])
def test_the_restore_event_carries_every_source(tier: str) -> None:
    event = schemas.CheckpointRestored(
        job="j",
        node="n",
        rank=0,
        step=3,
        tier=tier,
        duration_s=0.5,  # type: ignore[arg-type]
    )
    decoded = schemas.decode_event(schemas.encode(event))
    assert isinstance(decoded, schemas.CheckpointRestored) and decoded.tier == tier


def test_the_restore_event_refuses_a_name_not_in_the_table() -> None:
    event = schemas.CheckpointRestored(
        job="j", node="n", rank=0, step=3, tier="local", duration_s=0.5
    )
    raw = schemas.encode(event).replace(b"\xa5local", b"\xa4nvme")  # msgpack strings
    with pytest.raises(schemas.SchemaError, match=r"`\$\.tier`"):
        schemas.decode_event(raw)


def test_a_table_out_of_step_with_the_literals_fails_the_import_check() -> None:
    tiers.check_table(TIERS)
    without_shared = {name: row for name, row in TIERS.items() if name != "shared"}
    with pytest.raises(TypeError, match="RestoreSource"):
        tiers.check_table(without_shared)
    reordered = {"local": TIERS["local"], **TIERS}
    with pytest.raises(TypeError, match="RestoreSource"):
        tiers.check_table(reordered)
    misnamed = {**TIERS, "peer": dataclasses.replace(TIERS["peer"], name="object_store")}
    with pytest.raises(TypeError, match="RestoreSource"):
        tiers.check_table(misnamed)
    unstored = {**TIERS, "peer": dataclasses.replace(TIERS["peer"], stored=False)}
    with pytest.raises(TypeError, match="stored tiers"):
        tiers.check_table(unstored)
    far = {**TIERS, "peer": dataclasses.replace(TIERS["peer"], nearness=9)}
    with pytest.raises(TypeError, match="nearest first"):
        tiers.check_table(far)
