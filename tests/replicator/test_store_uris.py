"""The replicator by store URI: real replicator processes back up to a ``file://`` store,
announce its URI, and `goodput ckpt` follows an announced URI only when every live node
names it; a URI it cannot use is one line at the command line's edge."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from goodput import schemas
from goodput.checkpoint.index.records import NodeAddressRecord
from goodput.checkpoint.tiers.store_uri import LEGACY_ENDPOINT_KEY, StoreUri
from goodput.state_dir import StateDir
from goodput_services.replicator.options import ReplicatorOptions, store_uri
from tests.replicator.conftest import (
    Harness,
    ckpt_cli,
    file_checksums,
    in_store,
    peer_copies,
    write_checkpoint,
)

pytestmark = pytest.mark.timeout(240)
STEP = 10


def one_line_refusal(run, *says: str) -> None:
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert all(s in run.stderr for s in says), run.stderr


async def test_replicators_back_up_to_a_file_store_and_the_cli_follows_it(
    file_harness: Harness, tmp_path: Path
) -> None:
    h, reps = file_harness, file_harness.replicators
    shared = tmp_path / "shared store"
    uri = StoreUri("file", str(shared))
    reps.start("node-0", replicas="1")
    reps.start("node-1", replicas="1")
    saved = write_checkpoint(reps.volume("node-0"), STEP, seed=3)
    snapshot = await h.until(
        lambda s: peer_copies(s, "node-0", STEP) and in_store(s, "node-0", STEP),
        what="the peer copy and the backup to the file:// store",
    )
    assert {n.object_store for n in snapshot.live_nodes()} == {str(uri)}
    blobs = {p.name for p in (shared / "goodput" / "blobs").rglob("*") if p.is_file()}
    assert set(file_checksums(saved).values()) <= blobs
    assert not StateDir(reps.state_dir).object_store.exists(), "the default store went unused"
    (backed_up,) = await h.events_of(schemas.CheckpointBackedUp, 1, STEP)
    assert backed_up.uri.startswith(f"{uri}/") and "%20" in backed_up.uri

    # the store every live node announces, and the same one named by hand
    for named in ((), ("--object-store", str(uri)), ("--object-store", f"dir:{shared}")):
        run = ckpt_cli(h, "verify", "--deep", "--json", *named)
        copies = json.loads(run.stdout)["copies"]
        assert {c["tier"] for c in copies} >= {"object_store"} and all(c["ok"] for c in copies)

    one_line_refusal(
        ckpt_cli(h, "verify", "--object-store", "azure://bucket/x", check=False),
        "unknown scheme 'azure'",
        "gs://",
        "s3://",
    )

    # a record from the bus may be forged: one naming another store is not followed, and
    # gc deletes nothing anywhere; a store named on the command line still is
    decoy = tmp_path / "decoy"
    forged = NodeAddressRecord(
        node="node-9", host="127.0.0.1", port=1, object_store=f"file://{decoy}", ts=time.time_ns()
    )
    await h.index.announce(forged)
    for action in ("verify", "gc"):
        one_line_refusal(
            ckpt_cli(h, action, check=False), "announce different object stores", "--object-store"
        )
    assert not decoy.exists()
    assert ckpt_cli(h, "verify", "--object-store", str(uri)).returncode == 0


def test_options_of_before_still_start_and_a_bad_uri_is_one_line(tmp_path: Path) -> None:
    """Users' configurations spell ``gcs:<bucket>`` with the emulator apart: still accepted."""
    endpoint = "http://127.0.0.1:4443"
    old = ReplicatorOptions.from_mapping({"object_store": "gcs:b-1", LEGACY_ENDPOINT_KEY: endpoint})
    assert str(store_uri(old, tmp_path)) == f"gs://b-1?endpoint={endpoint}"
    bad_options = (
        {"object_store": "s3://b_1"},
        {"object_store": "s3://b-1", LEGACY_ENDPOINT_KEY: endpoint},
        {LEGACY_ENDPOINT_KEY: endpoint},
    )
    for bad in bad_options:
        says = r"^invalid replicator option: (object store|gcs_endpoint applies to a gs://)"
        with pytest.raises(SystemExit, match=says) as exc:
            ReplicatorOptions.from_mapping(bad)
        assert "\n" not in str(exc.value)
