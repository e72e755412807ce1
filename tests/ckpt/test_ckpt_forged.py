"""Forged checkpoints: whoever can write into a tier must not run code or corrupt memory on
a restoring rank. Each forgery is re-sealed (the unkeyed digest anyone can recompute), so
only the rules under test stand between it and the restore, which falls back to step 1."""

from __future__ import annotations

import base64
import os
import pickle
from pathlib import Path

import msgspec
import pytest
import torch

from goodput.checkpoint.engine import CheckpointEngine, verify_files
from goodput.checkpoint.engine.events import CheckpointRestored
from goodput.checkpoint.engine.host_restore import restore_from_host
from goodput.checkpoint.engine.torch_save import TorchSaveCheckpointer, checkpoint_path
from goodput.checkpoint.format import Manifest, read_manifest_bytes, step_dir, write_manifest

from .helpers import assert_bit_exact, make_state


class _Exploit:
    """Unpickling this runs ``touch <path>``: the marker proves whether code ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.path}",))


def _two_steps(root: Path, events: list[object]) -> CheckpointEngine:
    engine = CheckpointEngine(root, min_file_bytes=4096, listener=events.append)
    engine.save(make_state(1, scale=4), 1).wait()
    engine.save(make_state(2, scale=4), 2).wait()
    return engine


def _forge(root: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Rewrite step 2's manifest through ``edit`` and seal it again, as a forger can."""
    path = step_dir(root, 2)
    manifest = msgspec.json.decode(read_manifest_bytes(path), type=Manifest)
    write_manifest(path, edit(manifest))


def _forge_pickle_node(root: Path, marker: Path) -> None:
    """Step 2's tree gains a pickle node whose unpickling would create ``marker``."""
    payload = base64.b64encode(pickle.dumps(_Exploit(marker))).decode()

    def add_pickle(manifest: Manifest) -> Manifest:
        manifest.tree["items"].append(["evil", {"t": "pickle", "v": payload}])
        return manifest

    _forge(root, add_pickle)


def _assert_fell_back(engine: CheckpointEngine, events: list[object], reason: str) -> None:
    step, restored = engine.restore()
    assert step == 1
    assert_bit_exact(make_state(1, scale=4), restored)
    done = [e for e in events if isinstance(e, CheckpointRestored)][-1]
    assert [f.step for f in done.fallbacks] == [2]
    assert reason in done.fallbacks[0].reason, done.fallbacks[0].reason


def test_a_pickle_node_is_never_unpickled_and_restore_falls_back(tmp_path: Path) -> None:
    events: list[object] = []
    engine = _two_steps(tmp_path / "ckpt", events)
    marker = tmp_path / "code-ran"
    _forge_pickle_node(tmp_path / "ckpt", marker)
    _assert_fell_back(engine, events, "unknown kind 'pickle'")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("shape", "reason"),
    [
        (lambda s: [s[0] * 4, *s[1:]], "is not the"),  # bytes unchanged: 3/4 would be garbage
        (lambda s: [2**40], "is not the"),  # an allocation that cannot succeed
        (lambda s: [2**62, 2**62], "implausibly many elements"),
        (lambda s: [-1, *s[1:]], "invalid shape"),
    ],
    ids=["x4-same-bytes", "2**40", "numel-overflow", "negative"],
)
def test_a_shape_that_does_not_match_its_bytes_falls_back(tmp_path: Path, shape, reason) -> None:  # type: ignore[no-untyped-def]
    events: list[object] = []
    engine = _two_steps(tmp_path, events)

    def reshape(manifest: Manifest) -> Manifest:
        manifest.tensors[0].shape = shape(manifest.tensors[0].shape)
        return manifest

    _forge(tmp_path, reshape)
    _assert_fell_back(engine, events, reason)
    assert any(
        "is not the" in str(p) or reason in str(p) for p in verify_files(step_dir(tmp_path, 2))
    )


def test_bytes_claimed_outside_the_files_or_twice_fall_back(tmp_path: Path) -> None:
    events: list[object] = []
    engine = _two_steps(tmp_path, events)

    def overlap(manifest: Manifest) -> Manifest:
        manifest.tensors[1].offset = manifest.tensors[0].offset
        return manifest

    _forge(tmp_path, overlap)
    _assert_fell_back(engine, events, "overlap another tensor's")

    def beyond(manifest: Manifest) -> Manifest:
        manifest.tensors[1].offset = manifest.stream_bytes
        return manifest

    _forge(tmp_path, beyond)
    _assert_fell_back(engine, events, "outside the files")


def test_torch_save_refuses_a_malicious_pickle_and_falls_back(tmp_path: Path) -> None:
    ckpt = TorchSaveCheckpointer(tmp_path, writer=True)
    ckpt.save({"w": torch.ones(3)}, 1)
    marker = tmp_path / "code-ran"
    with open(checkpoint_path(tmp_path, 2), "wb") as out:
        pickle.dump({"w": _Exploit(marker)}, out, protocol=2)
    step, state = ckpt.restore()
    assert step == 1 and torch.equal(state["w"], torch.ones(3))
    assert not marker.exists()


def test_torch_save_refuses_dtensors_on_every_rank(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        mesh = init_device_mesh("cpu", (1,))
        state = {"model": {"w": distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])}}
        for writer in (True, False):
            ckpt = TorchSaveCheckpointer(tmp_path / "ckpt", writer=writer)
            with pytest.raises(ValueError, match="rank 1 would silently restore rank 0's shard"):
                ckpt.save(state, 1)
        assert ckpt.steps() == []
    finally:
        dist.destroy_process_group()


def test_a_forged_tree_in_host_memory_s_step_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    """The warm path (the rank's own buffer) reads the same manifest: a pickle node there
    makes the host restore say why it cannot serve the step, so the caller's volume restore
    falls back; it never raises out of the restarted rank, nor runs the payload."""
    events: list[object] = []
    engine = _two_steps(tmp_path / "ckpt", events)
    marker = tmp_path / "code-ran"
    _forge_pickle_node(tmp_path / "ckpt", marker)
    outcome = restore_from_host(engine, 2, make_state(2, scale=4))
    assert isinstance(outcome, str) and "unknown kind 'pickle'" in outcome, outcome
    assert not marker.exists()
    _assert_fell_back(engine, events, "unknown kind 'pickle'")
