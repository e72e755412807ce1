"""`goodput bench gpu` on this GPU, phase E (the per-step vote's cost) for real: the kit's
command, its phase process and its report as `just gpu-kit` runs them, in a minute.

With GOODPUT_GPU_KIT_OUT set, the report is also written there (bench-gpu-E.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from goodput.tools.cli.main import main
from tests.gpu.kit import GPU

pytestmark = [*GPU, pytest.mark.timeout(180)]


def test_bench_gpu_measures_the_vote_on_this_card(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "gpu", "--phases", "E", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    out = os.environ.get("GOODPUT_GPU_KIT_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "bench-gpu-E.json").write_text(json.dumps(report, indent=2))
    assert report["card"]["name"] == torch.cuda.get_device_name(0)
    assert report["card"]["torch"] == torch.__version__
    assert list(report["phases"]) == ["E"]
    figures = report["phases"]["E"]["figures"]
    assert figures["bench_shim"]["device_name"] == report["card"]["name"]
    for key in ("shim_with_pipelined_vote_overhead_ms", "blocking_vote_overhead_ms"):
        assert set(figures[key]) == {"min", "median", "max"}, figures[key]
    # the pipelined vote launched a ballot at every step of every block
    assert figures["bench_shim"]["votes"]["shim"]["launched"] > 0
