"""The replicator on an ``s3://`` store: real replicator processes back up to moto's S3
server by the store's URI (the endpoint and a prefix inside it), `goodput ckpt` follows the
URI they announce, and a node that lost its volume and its peer is refilled from the bucket,
bit-exact. Without boto3 a replicator given an ``s3://`` store stops in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from goodput import schemas
from goodput.checkpoint.tiers.s3_emulator import MotoS3Server
from goodput.checkpoint.tiers.store_uri import parse_store_uri
from tests.replicator.conftest import (
    Harness,
    assert_refilled_from_store,
    ckpt_cli,
    file_checksums,
    in_store,
    peer_copies,
    write_checkpoint,
)

pytestmark = pytest.mark.timeout(240)
STEP = 20


async def test_replicators_back_up_to_s3_and_a_node_is_restored_from_it(
    s3_harness: Harness, moto_s3: MotoS3Server
) -> None:
    h, reps = s3_harness, s3_harness.replicators
    uri = parse_store_uri(reps.store_options["object_store"].strip('"'))
    reps.start("node-0", replicas="1")
    reps.start("node-1", replicas="1")
    saved = write_checkpoint(reps.volume("node-0"), STEP, seed=5)
    expected = file_checksums(saved)
    snapshot = await h.until(
        lambda s: peer_copies(s, "node-0", STEP) and in_store(s, "node-0", STEP),
        what="the peer copy and the backup to the s3:// store",
    )
    assert {n.object_store for n in snapshot.live_nodes()} == {str(uri)}
    (backed_up,) = await h.events_of(schemas.CheckpointBackedUp, 1, STEP)
    assert backed_up.uri.startswith(f"s3://{uri.where}/cluster-a/")

    # content-addressed blobs under the URI's prefix, each carrying its checksum
    client = moto_s3.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=uri.where)
    keys = [o["Key"] for page in pages for o in page.get("Contents", ())]
    assert all(k.startswith("cluster-a/") for k in keys), keys
    blobs = {k.rsplit("/", 1)[1] for k in keys if k.startswith("cluster-a/goodput/blobs/")}
    assert set(expected.values()) <= blobs
    some = next(iter(expected.values()))
    head = client.head_object(Bucket=uri.where, Key=f"cluster-a/goodput/blobs/{some}")
    assert head["Metadata"] == {"xxh3_128": some}

    # the CLI opens the store the live nodes announce and reads every byte back
    copies = json.loads(ckpt_cli(h, "verify", "--deep", "--json").stdout)["copies"]
    assert {c["tier"] for c in copies} >= {"object_store"} and all(c["ok"] for c in copies)

    # the peer is lost (process and disk), then the node's volume: the bucket refills it
    await h.lose_node("node-1")
    shutil.rmtree(reps.node_dir("node-1"))
    await assert_refilled_from_store(h, "node-0", STEP, saved, expected, seed=5)


#: the replicator's entry point where boto3 is not installed
WITHOUT_BOTO3 = """
import runpy, sys
sys.modules["boto3"] = None
runpy.run_module("goodput_services.replicator", run_name="__main__")
"""


def test_without_the_s3_extra_the_replicator_stops_in_one_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable, "-c", WITHOUT_BOTO3,
            *("--job", "j", "--node", "n0", "--state-dir", str(tmp_path)),
            *("--nats-url", "nats://127.0.0.1:1", "--set", 'object_store="s3://bkt/p"'),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'goodput[s3]'" in lines[0], run.stderr
