"""`goodput bench gpu` without a GPU: the kit's dry form, its phase processes, its promises.

Without CUDA every phase is refused with a reason naming what is missing and the command
exits 3 ("nothing measured") with the report. A phase's process is real: what it reports
when its work fails (phase A asking for CUDA here) and when it runs past its budget is
pinned through it. Phases A and F (the bench ckpt code they call) run here on the CPU at a
small size, phase D's processes on the fake GPU node (tests/hostmon/fake_gpu_node.py); the
CUDA paths are the GPU kit's (tests/gpu/test_gpu_bench_kit.py runs phase E).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from goodput.tools.bench import gpu, gpu_ckpt, gpu_kill
from goodput.tools.bench.gpu_phases import PHASES, Phase
from goodput.tools.cli.main import main
from tests.conftest import goodput_cli, refused_in_one_line
from tests.hostmon.fake_gpu_node import add_xid

ROOT = Path(__file__).resolve().parents[2]
#: the kit's modules: none may reset a GPU or touch MIG
KIT_SOURCES = [
    *sorted((ROOT / "libs/goodput/tools/bench").glob("gpu*.py")),
    ROOT / "services/goodput_services/hostmon/kill_probe.py",
]
dry = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the dry form is the kit on a machine without CUDA"
)


@dry
def test_every_phase_is_refused_with_what_is_missing_and_nothing_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "gpu", "--json", "--out", str(tmp_path)]) == gpu.NOTHING_MEASURED
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert json.loads((tmp_path / "bench-gpu.json").read_text()) == report
    assert report["card"] == {
        "name": None,
        "driver": None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    assert list(report["phases"]) == list("ABCDEFG")
    for letter, outcome in report["phases"].items():
        assert set(outcome) == {"refused"}, outcome
        assert outcome["refused"].startswith("no CUDA device (torch"), outcome
        assert "\n" not in outcome["refused"]
        assert f"bench gpu {letter}: refused: " in err
    for letter in "BCF":
        assert "no NCCL in torch" in report["phases"][letter]["refused"]
    # the host monitor's probe says why it cannot read NVML (no driver library here)
    assert "; no NVML: NVML unavailable" in report["phases"]["D"]["refused"]
    assert report["budgets_s"] == {letter: PHASES[letter].budget_s for letter in "ABCDEFG"}
    assert 0 < report["wall_s"] < 60


@dry
def test_phases_selected_and_an_unknown_phase_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "gpu", "--phases", "e,B", "--json"]) == gpu.NOTHING_MEASURED
    assert list(json.loads(capsys.readouterr().out)["phases"]) == ["B", "E"]
    refused = goodput_cli("bench", "gpu", "--phases", "A,X", check=False)
    line = refused_in_one_line(refused, "unknown phase X", "A, B, C, D, E, F, G", code=2)
    assert line.startswith("goodput bench gpu: error: argument --phases")


def test_the_budgets_keep_the_kit_within_eight_minutes_and_are_in_its_help() -> None:
    assert sum(phase.budget_s for phase in PHASES.values()) <= 8 * 60 - 10
    shown = goodput_cli("bench", "gpu", "--help").stdout
    for letter, phase in PHASES.items():
        assert f"{letter} ≤ {phase.budget_s:g} s" in " ".join(shown.split()), letter
    assert "3 when nothing was measured" in " ".join(shown.split())


def test_no_kit_module_resets_a_gpu_or_touches_mig() -> None:
    assert len(KIT_SOURCES) >= 6
    forbidden = re.compile(r"gpu.reset|nvmlDeviceReset|Mig|GpuInstance|ComputeInstance|nvidia-smi")
    for source in KIT_SOURCES:
        found = forbidden.findall(source.read_text())
        assert not found, (source.name, found)


def test_a_phase_whose_work_fails_reports_one_line(tmp_path: Path) -> None:
    """Phase A in its own process, asking for CUDA where torch has none."""
    if torch.cuda.is_available():
        pytest.skip("phase A would run on this GPU")
    outcome = gpu.run_phase("A", tmp_path, 0.01)
    assert set(outcome) == {"failed"}, outcome
    assert "\n" not in outcome["failed"]
    assert "CUDA" in outcome["failed"], outcome


def test_a_phase_past_its_budget_is_killed_with_what_it_had_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process group goes (a victim or a rank with it); the partial figures stay."""
    script = tmp_path / "phase.py"
    script.write_text(
        "import json, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(tmp_path / 'child')!r}, 'w').write(str(child.pid))\n"
        "print('not json'); print(json.dumps({'partial': {'rounds': 5}}), flush=True)\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setitem(PHASES, "B", Phase("sleeps", 3, ()))
    monkeypatch.setattr(gpu, "command", lambda *_: [gpu.sys.executable, str(script)])
    started = time.monotonic()
    outcome = gpu.run_phase("B", tmp_path, 1.0)
    assert time.monotonic() - started < 30
    assert outcome == {"failed": "ran past its budget of 3 s", "partial": {"rounds": 5}}
    child = int((tmp_path / "child").read_text())
    assert _ends(child, within_s=10), "the phase's child survived its phase"


def _ends(pid: int, within_s: float) -> bool:
    """``pid`` is gone or a zombie within ``within_s`` (a killed process on a loaded machine
    shows as running until it is scheduled to exit)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_phase_d_kills_its_victim_and_reports_what_the_host_monitor_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Phase D's processes for real (its victim, the probe, the kill, the reaping) on the
    fake GPU node, the victim a sleeper: the XID the node reports after the kill, and the dead
    victim leaving the GPU's holders."""
    monkeypatch.setenv("GOODPUT_FAKE_GPU_HOLDERS", str(tmp_path / "holders"))
    monkeypatch.setenv("GOODPUT_FAKE_XIDS", str(tmp_path / "xids"))
    add_xid(tmp_path / "xids", 0, 43)
    monkeypatch.setattr(gpu_kill, "PROBE", "tests.hostmon.kill_probe_on_fake_node")
    monkeypatch.setattr(
        gpu_kill, "VICTIM", "print('running', flush=True)\nimport time\ntime.sleep(60)"
    )
    seen = gpu_kill.phase_d(argparse.Namespace(work=tmp_path, size_gb=1.0))
    assert seen["driver"] == "580.159.04"
    assert seen["victim_exit"] == -9
    assert seen["victim_listed_as_its_pid"] and len(seen["holders_before_kill"]) == 1
    assert seen["listed_after_kill_s"] is not None and seen["listed_after_kill_s"] < 5
    assert [entry["xid"] for entry in seen["xids"]] == [43]


def test_exit_status_says_what_was_measured() -> None:
    def status(*outcomes: dict) -> int:
        return gpu.exit_status({"phases": dict(zip("ABC", outcomes, strict=False))})

    assert status({"figures": {}}, {"refused": "no NVML"}) == 0
    assert status({"refused": "no CUDA"}, {"refused": "no CUDA"}) == gpu.NOTHING_MEASURED
    assert status({"figures": {}}, {"failed": "ran past its budget of 3 s"}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["A", "F"])
def test_the_checkpoint_phases_run_on_the_cpu(
    phase: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench ckpt code A and F call, on a small CPU state: every method restores what it
    saved (the GPU kit runs the same on CUDA state; G is `bench ckpt`, tests/ckpt's)."""
    monkeypatch.setattr(gpu_ckpt, "F_SIZE_GB", 0.01)
    args = argparse.Namespace(work=tmp_path, size_gb=0.02)
    run = {"A": gpu_ckpt.phase_a, "F": gpu_ckpt.phase_f}[phase]
    try:
        figures = run(args, device="cpu")
    finally:  # F formed this process's group (in the kit, its process ends with it)
        if dist.is_initialized():
            dist.destroy_process_group()
    if phase == "A":
        assert list(figures["methods"]) == list(gpu_ckpt.A_METHODS), figures["not_measured"]
        for method in figures["methods"].values():
            assert method["consistent"] and method["first_save_stall_s"] > 0
    else:
        assert figures["consistent"] and figures["dcp_consistent"], figures
        assert figures["restored_on"] == ["cpu"] and figures["restored_step"] == 1
