"""Replicators with the job's checkpoint key: signed checkpoints replicate as before over the
authenticated data plane; a forged one (no MAC) is never indexed or copied; a client without
the key reads nothing from a replicator; `goodput ckpt verify` checks the MACs."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from goodput.checkpoint.format import (
    Manifest,
    encode_manifest,
    read_manifest_bytes,
    write_manifest,
)
from goodput.checkpoint.format.job_key import KEY_FILE_ENV, create_key_file
from goodput.checkpoint.tiers.backup import listing_key
from goodput.checkpoint.tiers.peer import PeerClient, PeerError
from goodput.state_dir import StateDir
from tests.replicator.conftest import JOB, Harness, ckpt_cli, peer_copies, write_checkpoint


@pytest.mark.slow
async def test_keyed_replicators_copy_signed_steps_and_refuse_forgeries(
    dir_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    # as `goodput up` does: the key in the state directory, its path in the services' env
    key_file = create_key_file(StateDir(reps.state_dir).ckpt_key)
    monkeypatch.setenv(KEY_FILE_ENV, str(key_file))
    reps.start("node-0", replicas="1")
    reps.start("node-1", replicas="1")
    write_checkpoint(reps.volume("node-0"), 10, seed=1)
    await h.until(lambda s: peer_copies(s, "node-0", 10) == {"node-1"}, what="signed copy")

    # a step forged into node-0's volume by someone without the key: edited and re-sealed
    forged = write_checkpoint(reps.volume("node-0"), 20, seed=2)
    manifest = msgspec.json.decode(read_manifest_bytes(forged), type=Manifest)
    manifest.metadata["forged"] = True
    write_manifest(forged, manifest, key=None)
    write_checkpoint(reps.volume("node-0"), 30, seed=3)
    await h.until(lambda s: peer_copies(s, "node-0", 30) == {"node-1"}, what="step 30 copied")
    snapshot = await h.snapshot()
    assert not [c for c in snapshot.copies if c.step == 20]
    assert not (reps.node_dir("node-1") / "peer" / JOB / "node-0" / forged.name).exists()

    # the replicator's data plane: nothing for a client without the key
    holder = snapshot.nodes["node-1"]
    async with await PeerClient.connect(holder.host, holder.port, key=None) as client:
        with pytest.raises(PeerError, match="requires the job's checkpoint key"):
            await client.fetch_manifest(f"peer/{JOB}/node-0/step-0000000030")
    for _ in range(50):  # the server logs its refusal after answering it
        if "peer connection from" in reps.log("node-1"):
            break
        await asyncio.sleep(0.1)
    (refusal,) = [line for line in reps.log("node-1").splitlines() if "refused" in line]
    assert "without proving the job's checkpoint key" in refusal

    # the CLI finds the stack's key in its state directory and checks the MACs with it
    monkeypatch.delenv(KEY_FILE_ENV)
    run = ckpt_cli(h, "verify", "--all", "--json")
    verified = json.loads(run.stdout)
    assert verified["authenticated"] is True and "unauthenticated" not in run.stderr
    assert verified["copies"] and all(c["ok"] for c in verified["copies"])
    # a backup listing a forger replaced in the object store: verify reports it
    listing = StateDir(reps.state_dir).object_store / listing_key(f"{JOB}/node-0", 30)
    unsigned = msgspec.json.decode(listing.read_bytes(), type=Manifest)
    listing.write_bytes(encode_manifest(unsigned, key=None))
    bad = ckpt_cli(h, "verify", "--step", "30", "--json", check=False)
    assert bad.returncode == 1, bad.stdout
    problems = [c for c in json.loads(bad.stdout)["copies"] if not c["ok"]]
    assert [(c["tier"], c["holder"]) for c in problems] == [("object_store", "store")]
    assert "not signed with the job's key" in problems[0]["problems"][0]

    # a peer copy whose manifest a forger replaced: its holder withdraws it from the index
    peer_copy = reps.node_dir("node-1") / "peer" / JOB / "node-0" / "step-0000000030"
    forged_copy = msgspec.json.decode(read_manifest_bytes(peer_copy), type=Manifest)
    write_manifest(peer_copy, forged_copy, key=None)
    await h.until(lambda s: not peer_copies(s, "node-0", 30), what="forged copy withdrawn")
