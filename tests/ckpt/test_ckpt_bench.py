"""`goodput bench ckpt` end to end on a tiny state: it runs and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from goodput.tools.bench import ckpt as bench_ckpt
from goodput.tools.bench.ckpt import vs_best_peer
from goodput.tools.bench.ckpt_measure import MethodResult
from goodput.tools.cli.main import main
from tests.conftest import goodput_cli

FIELDS = {"stall_s", "durable_s", "write_gbps", "restore_s", "restore_gbps", "peak_extra_mem_ratio"}


def _bench(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    args = ["bench", "ckpt", "--size-gb", "0.02", "--saves", "2", "--batch", "2"]
    code = main([*args, "--dir", str(tmp_path), "--json", *extra])
    assert code == 0
    assert list(tmp_path.iterdir()) == [], "the benchmark cleans up after itself"
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_bench_ckpt_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench(tmp_path, capsys)
    assert set(report["methods"]) == {
        "torch_save",
        "dcp_save",
        "dcp_async_save",
        "goodput",
        "goodput_blocking",
    }
    for figures in report["methods"].values():
        assert set(figures) >= FIELDS
        assert all(figures[name] >= 0 for name in FIELDS)
        assert figures["consistent"] is True
    assert report["raw_write_gbps"] > 0 and report["raw_read_gbps"] > 0
    assert report["cache_drop"] in {"drop_caches", "fadvise_dontneed"}


@pytest.mark.slow
@pytest.mark.timeout(900)  # seven methods, one in DCP's checkpoint process; slow when loaded
def test_bench_ckpt_peers_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench(tmp_path, capsys, "--peers")
    measured = set(report["methods"]) | set(report["peers_not_measured"])
    assert measured >= {
        "goodput",
        "goodput_blocking",
        "torch_save",
        "dcp_async_thread_staged",
        "dcp_async_process_staged",
        "goodput_dcp_writer",
        "torchsnapshot_async_take",
        "nvrx_async",
    }
    # on this torch every peer that is installed runs: none is reported as failed
    assert not [why for why in report["peers_not_measured"].values() if why.startswith("failed")]
    assert all(figures["consistent"] for figures in report["methods"].values())
    assert set(report["vs_best_peer"]) >= {"stall", "durable", "restore"}
    assert set(report["goodput_dcp_writer_vs_dcp_writer"]) == {"stall", "durable", "restore"}


@pytest.mark.slow
def test_a_peer_that_fails_is_reported_and_the_others_still_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As DCP's staged async save did on torch 2.11 with CUDA state (docs/BENCHMARKS.md)."""
    real_factories = bench_ckpt.factories

    def factories_with_a_failing_peer(training, writer_threads):  # type: ignore[no-untyped-def]
        made = real_factories(training, writer_threads)

        def failing_peer(directory: Path) -> None:
            raise KeyError(type)

        made["dcp_async_thread_staged"] = failing_peer
        return made

    monkeypatch.setattr(bench_ckpt, "PEERS", ("torch_save", "dcp_async_thread_staged"))
    monkeypatch.setattr(bench_ckpt, "factories", factories_with_a_failing_peer)
    report = _bench(tmp_path, capsys, "--peers")
    assert set(report["methods"]) == {"goodput", "goodput_blocking", "torch_save"}
    assert report["peers_not_measured"]["dcp_async_thread_staged"] == (
        "failed: KeyError: <class 'type'>"
    )
    assert report["vs_best_peer"]["stall_best_peer"] == "torch_save"


def _result(stall: float, durable: float, restore: float, consistent: bool = True) -> MethodResult:
    return MethodResult(
        stall_s=stall,
        durable_s=durable,
        write_gbps=1.0,
        restore_s=restore,
        restore_gbps=1.0,
        peak_extra_mem_ratio=1.0,
        consistent=consistent,
        forward_backward_s=0.1,
    )


def test_an_unsafe_peer_is_never_the_best_peer_for_stall_or_durable() -> None:
    report = vs_best_peer(
        {
            "goodput": _result(0.1, 2.0, 1.0),
            "fast_but_unsafe": _result(0.001, 0.5, 0.5, consistent=False),
            "safe": _result(0.4, 4.0, 2.0),
        }
    )
    assert report["stall"] == pytest.approx(0.25) and report["stall_best_peer"] == "safe"
    assert report["durable"] == pytest.approx(0.5)
    assert report["restore"] == pytest.approx(2.0)  # restore: against every peer
    assert report["unsafe_peers"] == ["fast_but_unsafe"]


def test_goodputs_own_dcp_writer_is_not_a_peer() -> None:
    report = vs_best_peer(
        {
            "goodput": _result(0.1, 2.0, 1.0),
            "goodput_dcp_writer": _result(0.01, 0.5, 0.5),
            "safe": _result(0.4, 4.0, 2.0),
        }
    )
    assert report["stall_best_peer"] == report["restore_best_peer"] == "safe"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: tests/gpu runs it")
def test_bench_ckpt_on_cuda_is_refused_in_one_line_without_a_gpu(tmp_path: Path) -> None:
    result = goodput_cli("bench", "ckpt", "--device", "cuda", "--dir", str(tmp_path), check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"goodput bench ckpt: error: argument --device: cuda: CUDA is not available here"
        f" (torch {torch.__version__})"
    ]
    assert list(tmp_path.iterdir()) == []
