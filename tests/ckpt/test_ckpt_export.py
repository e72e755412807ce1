"""`goodput ckpt export --dcp`: goodput checkpoints read back with plain DCP, bit for bit.

The documented example (``goodput.examples.dcp_export``) runs as two real gloo ranks under
``torch.distributed.run``: FSDP2 saved through the engine, exported by the CLI, loaded with
``dcp.load`` into a fresh FSDP2 model on both ranks and with ``dcp_to_torch_save``. Its
sharded checkpoint is then cut into the per-node parts of the format contract
(``goodput.checkpoint.format.parts``: one step directory per part, one commit table), which
must export to the same tensors from two volumes or from one volume with a staged part; a part
missing, or a flipped byte, fails in one line and leaves nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.export.dcp import export_dcp
from goodput.checkpoint.export.sources import ExportError, find_checkpoint
from goodput.checkpoint.format import read_manifest, step_dir, write_manifest
from goodput.checkpoint.format.parts import PartOf, staged_part_dir, summarize
from tests.ckpt.helpers import assert_bit_exact
from tests.conftest import goodput_cli, refused_in_one_line
from tests.examples.launch import free_port

pytestmark = pytest.mark.slow

STEP = 3  # the example's saved step


def run_example(workdir: Path, *extra: str) -> str:
    """The documented command, on two ranks; its output."""
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         f"--master-port={free_port()}", "-m", "goodput.examples.dcp_export", str(workdir),
         *extra],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The example's directory after a run on two ranks sharing a root, and its output."""
    workdir = tmp_path_factory.mktemp("dcp-example")
    return workdir, run_example(workdir)


def test_the_example_loads_the_export_into_fsdp2_bit_for_bit(example: tuple[Path, str]) -> None:
    workdir, output = example
    assert "rank 0: identical" in output and "rank 1: identical" in output, output[-3000:]
    assert "exported step 3 (engine-sharded)" in output
    assert sorted(p.name for p in (workdir / "dcp").iterdir()) == [".metadata", "__0_0.distcp"]
    assert not [p for p in workdir.iterdir() if p.name.startswith(".")]  # no staging left


def test_the_example_exports_the_engines_parts_from_every_nodes_volume(tmp_path: Path) -> None:
    """The engine's own parts (``PartLayout``, a volume per node), exported from both volumes."""
    output = run_example(tmp_path, "--parts")
    assert "rank 0: identical" in output and "rank 1: identical" in output, output[-3000:]
    assert "exported step 3 (engine-sharded, 2 parts of commit" in output
    for node in ("node0", "node1"):
        part = read_manifest(step_dir(tmp_path / "goodput" / node, STEP)).part
        assert isinstance(part, PartOf) and part.part == int(node[-1])


def _split_into_parts(whole: Path, volumes: list[Path]) -> list[Path]:
    """The example's step cut as the engine writes it across nodes: rank k's files in part k
    on volume k, each manifest naming its part and the commit table of both."""
    manifest = read_manifest(whole)
    files = [[e for e in manifest.files if e.dp_rank == k] for k in range(len(volumes))]
    table = [summarize(k, [k], part_files) for k, part_files in enumerate(files)]
    parts = []
    for k, volume in enumerate(volumes):
        directory = step_dir(volume, STEP)
        directory.mkdir(parents=True)
        for entry in files[k]:
            shutil.copy(whole / entry.name, directory / entry.name)
        own = msgspec.structs.replace(manifest, files=files[k], part=PartOf(part=k, table=table))
        write_manifest(directory, own)
        parts.append(directory)
    return parts


def _consolidated(dcp_dir: Path, out: Path) -> dict[str, Any]:
    dcp_to_torch_save(dcp_dir, out)
    return torch.load(out, weights_only=True)


def test_parts_of_one_commit_export_like_the_whole(
    example: tuple[Path, str], tmp_path: Path
) -> None:
    workdir, _ = example
    expected = torch.load(workdir / "consolidated.pt", weights_only=True)
    volumes = [tmp_path / "node0", tmp_path / "node1"]
    part0, part1 = _split_into_parts(step_dir(workdir / "goodput", STEP), volumes)

    # from the two nodes' volumes
    checkpoint = find_checkpoint(volumes)
    assert [c.path for c in checkpoint.copies] == [part0, part1] and checkpoint.commit
    seen: list[tuple[int, int]] = []
    report = export_dcp(
        checkpoint, tmp_path / "from-volumes", progress=lambda *done_total: seen.append(done_total)
    )
    assert (report.parts, report.step) == (2, STEP)
    assert seen[-1] == (report.bytes, report.bytes) and seen == sorted(seen)
    assert_bit_exact(expected, _consolidated(tmp_path / "from-volumes", tmp_path / "a.pt"))

    # from one volume, the other part staged beside its own
    shutil.copytree(part1, staged_part_dir(volumes[0], STEP, 1))
    export_dcp(find_checkpoint([volumes[0]]), tmp_path / "from-staged")
    assert_bit_exact(expected, _consolidated(tmp_path / "from-staged", tmp_path / "b.pt"))

    # a part staged under another part's name, or a step directory renamed, is not offered
    shutil.copytree(part1, staged_part_dir(volumes[1], STEP, 0))
    shutil.copytree(part0, step_dir(volumes[1], STEP + 1))
    with pytest.raises(ExportError, match="named part 0, its manifest is not that part"):
        find_checkpoint([volumes[1]])
    checkpoint = find_checkpoint([volumes[1], volumes[0]])
    assert [c.path for c in checkpoint.copies] == [part0, part1]  # step 4's copy was refused

    # a part alone is no checkpoint: one line naming the missing part, nothing written
    result = goodput_cli(
        "ckpt", "export", str(part1), "--dcp", str(tmp_path / "alone"), check=False
    )
    refused_in_one_line(result, "parts [0] of 2 not among the paths", code=1)
    assert not (tmp_path / "alone").exists()


def test_a_flipped_byte_fails_the_export_and_leaves_nothing(
    example: tuple[Path, str], tmp_path: Path
) -> None:
    workdir, _ = example
    copy = tmp_path / "step"
    shutil.copytree(step_dir(workdir / "goodput", STEP), copy)
    data = copy / "data-r00001-000.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(ExportError, match=r"rank 1, .*: block 0 fails its checksum"):
        export_dcp(find_checkpoint([copy]), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step"]


def _plain_state() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(7)
    model = OrderedDict(
        (f"layer{i}.weight", torch.randn(40, 24, generator=generator)) for i in range(3)
    )
    model["layer0.bias"] = torch.randn(40, generator=generator).to(torch.bfloat16)
    return {
        "model": model,
        "optim": {
            "state": {
                name: {"step": torch.tensor(5.0), "exp_avg": torch.randn(40, 24)}
                for name in ("layer0.weight", "layer1.weight")
            },
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": ["layer0.weight"]}],
        },
        "step": 5,
        "mask": torch.rand(17, generator=generator) > 0.5,
        "empty": torch.empty(0, 3),
        "note": "plain",
    }


def test_a_whole_checkpoint_exports_and_loads(tmp_path: Path) -> None:
    state = _plain_state()
    with CheckpointEngine(tmp_path / "volume") as engine:
        assert engine.save(state, 5).wait(120).error is None
    result = goodput_cli(
        "ckpt", "export", str(tmp_path / "volume"), "--dcp", str(tmp_path / "dcp"), "--json"
    )
    report = json.loads(result.stdout)
    assert (report["kind"], report["step"], report["parts"], report["tensors"]) == (
        "engine", 5, 1, 10,
    )  # fmt: skip
    # dcp.load into a template in one process, and DCP's own consolidation
    template = _plain_state()
    for tensor in [*template["model"].values(), template["mask"]]:
        tensor.zero_()
    template["step"], template["note"] = 0, ""
    dcp.load(template, checkpoint_id=tmp_path / "dcp", no_dist=True)
    assert_bit_exact(state, template)
    consolidated = _consolidated(tmp_path / "dcp", tmp_path / "c.pt")
    assert_bit_exact(dict(state["model"]), consolidated["model"])  # DCP nests plain dicts
    assert consolidated["optim"]["param_groups"][0]["betas"] == (0.9, 0.999)

    # the destination exists: refused in one line, nothing touched
    again = goodput_cli(
        "ckpt", "export", str(tmp_path / "volume"), "--dcp", str(tmp_path / "dcp"), check=False
    )
    assert again.returncode == 1 and "not an empty directory" in again.stderr

    # a flipped byte past the last tensor is found by the file's digest: nothing published
    data = next((step_dir(tmp_path / "volume", 5)).glob("data-*"))
    with open(data, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(ExportError, match="fails its checksum"):
        export_dcp(find_checkpoint([tmp_path / "volume"]), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ({"ids": np.arange(3), "w": torch.ones(2)}, "convert meta device type tensor to numpy"),
        ({"pair": (torch.ones(2), 1)}, "pair: tensors inside a tuple"),
        ([torch.ones(2)], "the saved state is a list; DCP holds dicts"),
    ],
)
def test_a_state_dcp_cannot_key_is_refused_in_one_line(
    state: Any, why: str, tmp_path: Path
) -> None:
    with CheckpointEngine(tmp_path / "volume") as engine:
        assert engine.save(state, 1).wait(120).error is None
    with pytest.raises(ExportError, match=why):
        export_dcp(find_checkpoint([tmp_path / "volume"]), tmp_path / "out")
    assert not (tmp_path / "out").exists()
