"""The simulator: real decision code on a simulated clock, strict inputs, deterministic output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from goodput import schemas
from goodput.measure.accounting.categories import BADPUT_KEYS
from goodput.supervisor.detect.detector import Detector
from goodput.tools.simulate.fleet import make_trace
from goodput.tools.simulate.profile import SimulateError, load_preset, load_profile
from goodput.tools.simulate.run import simulate, with_job
from goodput.tools.simulate.strategies import pick

NS = 1_000_000_000
ROOT = Path(__file__).resolve().parents[2]


def short_case_study(hours: float = 12.0):
    return with_job(load_preset("case-study"), hours=hours)


def test_shipped_inputs_load():
    preset = load_preset("llama3-16k")
    assert preset.job.nodes * preset.job.gpus_per_node == 16_384
    assert load_profile(preset.profile).checkpoint.object_every >= 1
    # the profile calibrated from this machine's benchmarks ships too
    assert load_profile("local-bench").restart.startup_s > 0


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("snapshot_gbps = -1.0", "snapshot_gbps"),
        ("", "snapshot_gbps"),
        ("snapshot_gbps = 1.0\nbogus = 2", "bogus"),
    ],
)
def test_a_bad_profile_is_one_line_naming_the_field(tmp_path, text, field):
    shipped = (ROOT / "libs/goodput/tools/simulate/profiles/large-gpu.toml").read_text()
    lines = [line for line in shipped.splitlines() if not line.startswith("snapshot_gbps")]
    at = lines.index("[checkpoint]") + 1
    lines[at:at] = text.splitlines()
    bad = tmp_path / "bad.toml"
    bad.write_text("\n".join(lines))
    with pytest.raises(SimulateError) as caught:
        load_profile(str(bad))
    assert field in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_trace_is_seeded_and_shared():
    preset = load_preset("case-study")
    one = make_trace(preset.job, preset.failures, 7)
    assert one == make_trace(preset.job, preset.failures, 7)
    assert one != make_trace(preset.job, preset.failures, 8)


def test_goodput_beats_the_baseline_and_every_second_is_accounted():
    preset = short_case_study()
    result = simulate(preset, load_profile(preset.profile), pick(["baseline", "goodput"]), seed=3)
    baseline, goodput = result["strategies"]["baseline"], result["strategies"]["goodput"]
    assert goodput["goodput_pct"] > baseline["goodput_pct"]
    for summary in (baseline, goodput):
        assert set(summary["badput"]) == set(BADPUT_KEYS)
        assert summary["goodput_pct"] + sum(summary["badput_pct"].values()) == pytest.approx(
            100, abs=0.05
        )
    # the real controller decided: its built-in rules and the baseline script's rules show
    assert any(rule.startswith("baseline-") for rule in baseline["rules"])
    assert not any(rule.startswith("baseline-") for rule in goodput["rules"])


def test_the_same_seed_gives_the_same_answer():
    preset = short_case_study(6)
    profile = load_profile(preset.profile)
    first = simulate(preset, profile, pick(["goodput"]), seed=5)["strategies"]
    again = simulate(preset, profile, pick(["goodput"]), seed=5)["strategies"]
    assert first["goodput"]["goodput_pct"] == again["goodput"]["goodput_pct"]
    assert first["goodput"]["rules"] == again["goodput"]["rules"]


def test_a_lost_node_returns_when_its_host_reports_healthy():
    detector = Detector("j")
    t = 1_700_000_000 * NS
    detector.on_event(
        schemas.RankStarted(
            job="j", ts=t, node="n0", rank=0, local_rank=0, world_size=1, pid=1, attempt=1
        ),
        t,
    )
    detector.on_event(schemas.Heartbeat(job="j", ts=t, node="n0", rank=0, pid=1, step=0), t)
    lost = detector.poll(t + 10 * NS)
    assert [(s.signal, s.severity) for s in lost] == [("missed_heartbeat", "uncorrectable")]
    back = detector.on_event(
        schemas.HostHealth(job="j", ts=t, node="n0", healthy=True, gpu_available=True),
        t + 20 * NS,
    )
    assert [s.signal for s in back] == ["node_returned"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": f"{ROOT}/libs:{ROOT}/services", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "goodput.tools.cli.main", "simulate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_json_shape():
    done = _cli(
        "--preset", "case-study", "--hours", "4", "--strategies", "baseline,goodput", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {"strategies", "gpus", "hours", "interruptions", "wall_s"} <= set(result)
    assert result["gpus"] == 1024
    assert set(result["strategies"]) == {"baseline", "goodput"}
    assert "goodput_pct" in result["strategies"]["goodput"]


def test_cli_bad_input_is_one_line(tmp_path):
    done = _cli("--strategies", "nope")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "nope" in done.stderr
    raising = tmp_path / "raising.py"
    raising.write_text("def decide(signal, state):\n    raise RuntimeError('boom')\n")
    done = _cli("--hours", "20", "--strategies", "goodput", "--policy", str(raising))
    assert done.returncode == 2
    assert "raising" in done.stderr and "Traceback" not in done.stderr


def test_cli_html_writes_the_page_and_plot(tmp_path):
    done = _cli("--hours", "3", "--strategies", "baseline,goodput", "--html", str(tmp_path))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "simulation.html").read_text()
    assert "A simulation, not a measurement" in page and "goodput" in page
    assert (tmp_path / "goodput.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "result.json").read_text())["gpus"] == 1024


def test_a_spares_sweep_plots_and_recommends(tmp_path):
    from goodput.tools.simulate.sweep import plot, recommendation, sweep

    preset = short_case_study(4)
    result = sweep(preset, load_profile(preset.profile), "spares", [0, 2], pick(["goodput"]))
    assert [p["value"] for p in result["points"]] == [0, 2]
    line = recommendation(result, preset.job.step_time_s, preset.job.hours)
    assert line.startswith("with ") and "spare node(s)" in line and "simulated" in line
    assert plot(result, tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SimulateError, match="whole replicas"):
        sweep(preset, load_profile(preset.profile), "size", [100], pick(["goodput"]))


def test_a_spares_sweep_holds_the_job_nodes_faults_fixed():
    """Common random numbers: the job's nodes see the same faults at every spare count (a
    spare draws its own from a stream of its own), so the baseline, which uses no spare,
    scores the same at every point."""
    from goodput.tools.simulate.fleet import make_trace
    from goodput.tools.simulate.sweep import sweep

    preset = short_case_study(12)
    job = preset.job
    traces = [make_trace(with_job(preset, spares=s).job, preset.failures, 3) for s in (0, 1, 4)]
    on_job = [[f for f in t if int(f.node.split("-")[1]) < job.nodes] for t in traces]
    assert on_job[0] == on_job[1] == on_job[2] and on_job[0]
    spare_0 = [[f for f in t if f.node == f"node-{job.nodes}"] for t in traces[1:]]
    assert spare_0[0] == spare_0[1]  # a spare's faults do not move with the spare count
    result = sweep(preset, load_profile(preset.profile), "spares", [0, 1, 4], pick(["baseline"]))
    assert len({p["goodput_pct"] for p in result["points"]}) == 1, result["points"]


def _one_fault_world(strategy: str, kind: str):
    from goodput.tools.simulate.fleet import Fault
    from goodput.tools.simulate.strategies import strategies
    from goodput.tools.simulate.world import World

    preset = short_case_study(2)
    trace = [Fault(at_s=1800.0, node="node-5", kind=kind, duration_s=7200.0)]  # type: ignore[arg-type]
    return World(preset.job, load_profile(preset.profile), strategies()[strategy], trace)


def test_a_correctable_gpu_fault_is_reset_in_place_and_the_node_kept():
    goodput = _one_fault_world("goodput", "correctable")
    result = goodput.run()
    assert result.rules.get("gpu-reset") == 1
    assert "hot-swap" not in result.rules and "scale-down" not in result.rules
    assert "node-5" in goodput.actuator.membership.active
    # the same fault read as uncorrectable (XID 79) costs the node: swapped for a spare
    swapped = _one_fault_world("goodput", "gpu_xid")
    assert swapped.run().rules.get("hot-swap") == 1
    assert "node-5" not in swapped.actuator.membership.active
    # without the rung the job waits for the node's repair: far more lost
    baseline = _one_fault_world("baseline", "correctable").run()
    assert baseline.badput["job_down"] + baseline.badput["restart_reprovision"] > 3600
    assert result.goodput_pct > baseline.goodput_pct


def _faults_world(strategy: str, *faults: tuple[float, str, str]):
    from goodput.tools.simulate.fleet import Fault
    from goodput.tools.simulate.strategies import strategies
    from goodput.tools.simulate.world import World

    preset = short_case_study(2)
    trace = [Fault(at, node, kind, 7200.0) for at, node, kind in faults]  # type: ignore[arg-type]
    return World(preset.job, load_profile(preset.profile), strategies()[strategy], trace)


def test_an_in_process_restart_is_priced_warm_with_a_ready_standby():
    """The crashed rank's place goes to its node's standby: the profile's rejoin and warm
    start-up, not a cold relaunch; the same policy without standbys starts that rank cold."""
    restart = load_profile("large-gpu").restart
    warm = _faults_world("goodput", (1800.0, "node-5", "crash")).run()
    cold = _faults_world("+scale-down/up", (1800.0, "node-5", "crash")).run()
    assert warm.rules["in-process-restart"] == cold.rules["in-process-restart"] == 1
    assert warm.badput["restart_reprovision"] == pytest.approx(restart.rejoin_s, abs=1)
    assert warm.badput["program_startup"] == pytest.approx(
        restart.startup_s + restart.warm_startup_s, abs=1
    )  # the job's first start is cold, the restart's warm
    assert cold.badput["restart_reprovision"] == pytest.approx(restart.launch_s, abs=1)
    assert cold.badput["program_startup"] == pytest.approx(2 * restart.startup_s, abs=1)
    assert warm.goodput_pct > cold.goodput_pct


def test_an_in_process_restart_fails_on_a_broken_node_and_a_cold_one_follows():
    """As the real backend: a live rank on a node that broke cannot rejoin, so the warm
    restart fails, every rank stops, and the controller decides again without it."""
    world = _faults_world("goodput", (1800.0, "node-5", "crash"), (1800.5, "node-7", "lost_host"))
    result = world.run()
    refused = [r for r in world.state.refused if r.action == "restart_in_process"]
    assert len(refused) == 1 and "did not rejoin" in refused[0].reason
    assert "node-7" not in world.actuator.membership.active
    assert {"in-process-restart", "hot-swap"} <= set(result.rules)
