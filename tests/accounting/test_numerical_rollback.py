"""A numerical rollback is its own badput category: a hand-computed log with a NaN rolled back
and a crash rolled back after it (seconds; one rank).

====================  ==========================================  =====================
 seconds               what happens                                 category
====================  ==========================================  =====================
  0 – 4                rank starts, step 1 begins at 4              program_startup 4
  4 – 12               steps 1–4, 2 s each                          productive 8
 12 – 12.5             checkpoint of step 4 blocks training         checkpoint_save 0.5
 12.5 – 18.5           steps 5, 6, 7; step 7's loss is NaN          numerical_rollback 6
 18.5 – 19             the sensor signals `nonfinite` at 19         failure_detection 0.5
 19 – 20               the controller decides the rollback at 20    decision 1
 20 – 23               the rank restarts (up at 23)                 restart_reprovision 3
 23 – 23.5             startup before the restore                   program_startup 0.5
 23.5 – 25             restore of step 4 (1.5 s)                    numerical_rollback 1.5
 25 – 29               steps 5, 6 again                             productive 4
 29 – 29.5             checkpoint of step 6                         checkpoint_save 0.5
 29.5 – 33.5           steps 7, 8 (later re-run)                    wasted_progress 4
 33.5 – 34.5           the rank crashes mid-step at 34.5            wasted_progress 1
 34.5 – 35             the sensor signals the crash at 35           failure_detection 0.5
 35 – 36               the controller decides at 36                 decision 1
 36 – 39               the rank restarts (up at 39)                 restart_reprovision 3
 39 – 40               restore of step 6 (1 s)                      checkpoint_restore 1
 40 – 46               steps 7, 8, 9                                productive 6
 46 – 47               stopped                                      job_down 1
====================  ==========================================  =====================
"""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from goodput import schemas
from goodput.measure import metrics
from goodput.measure.accounting import BADPUT_KEYS, compute_goodput, write_event_log
from goodput.measure.accounting.html import write_html_report
from goodput.measure.accounting.plots import COLORS
from tests.accounting.scenario import JOB, at, started, step
from tests.conftest import goodput_cli

EXPECTED = {
    "checkpoint_save": 1.0,
    "wasted_progress": 5.0,
    "numerical_rollback": 7.5,
    "failure_detection": 1.0,
    "decision": 2.0,
    "restart_reprovision": 6.0,
    "checkpoint_restore": 1.0,
    "program_startup": 4.5,
    "straggler_slowdown": 0.0,
    "scaled_down_idle": 0.0,
    "job_down": 1.0,
}


def _fault(signal_id: str, kind: schemas.SignalKind, observed: float, seen: float, decided: float):
    signal = schemas.Signal(
        job=JOB, ts=at(seen), signal_id=signal_id, signal=kind, node="n0", rank=0,
        observed_ts=at(observed),
    )  # fmt: skip
    decision = schemas.Decision(
        job=JOB, ts=at(decided), signal_id=signal_id, policy="default", rule=f"{kind}-rule",
        reason=kind, command_ids=[f"cmd-{signal_id}"],
    )  # fmt: skip
    return [signal, decision]


def _saved(t: float, number: int) -> schemas.CheckpointSaved:
    return schemas.CheckpointSaved(
        job=JOB, ts=at(t), node="n0", rank=0, step=number, stall_s=0.5, bytes=1
    )


def _restored(t: float, number: int, seconds: float) -> schemas.CheckpointRestored:
    return schemas.CheckpointRestored(
        job=JOB, ts=at(t), node="n0", rank=0, step=number, tier="local", duration_s=seconds
    )


def _exited(t: float, code: int, reason: str) -> schemas.RankExited:
    return schemas.RankExited(
        job=JOB, ts=at(t), node="n0", rank=0, pid=100, exit_code=code, expected_reason=reason
    )


def nan_then_crash() -> list[schemas.Event]:
    events: list[schemas.Event] = [started(0, 0, 1)]
    for number, t in enumerate((6, 8, 10, 12), start=1):
        events += step(t, number, 2.0, 1)
    events.append(_saved(12.5, 4))
    for number, t in zip((5, 6, 7), (14.5, 16.5, 18.5), strict=True):
        events += step(t, number, 2.0, 1)
    events += _fault("sig-nan", "nonfinite", observed=18.5, seen=19, decided=20)
    events += [_exited(20.5, 0, "restart"), started(23, 0, 1), _restored(25, 4, 1.5)]
    events += step(27, 5, 2.0, 1) + step(29, 6, 2.0, 1)
    events.append(_saved(29.5, 6))
    events += step(31.5, 7, 2.0, 1) + step(33.5, 8, 2.0, 1)
    events += [_exited(34.5, 1, "")]
    events += _fault("sig-crash", "crash", observed=34.5, seen=35, decided=36)
    events += [started(39, 0, 1), _restored(40, 6, 1.0)]
    events += step(42, 7, 2.0, 1) + step(44, 8, 2.0, 1) + step(46, 9, 2.0, 1)
    events.append(_exited(47, 0, "stop"))
    return events


def test_a_nan_rollback_is_charged_to_its_own_category_and_a_crash_is_not() -> None:
    report = compute_goodput(nan_then_crash())
    assert set(report.badput) == set(BADPUT_KEYS) == set(EXPECTED)
    for key, seconds in EXPECTED.items():
        assert report.badput[key] == pytest.approx(seconds, abs=1e-6), key
    assert report.productive_s == pytest.approx(18, abs=1e-6)
    assert report.total_s == pytest.approx(47, abs=1e-6)
    assert report.interruptions == 2
    assert [f.cause for f in report.failures] == ["nonfinite", "crash, rank_exit"]
    assert report.steps_wasted == 5  # 5, 6, 7 of the first attempt, 7 and 8 of the second
    owners = {(round(s.start_s, 3), round(s.end_s, 3)): s.category for s in report.timeline.spans}
    assert owners[(12.5, 18.5)] == owners[(23.5, 25)] == "numerical_rollback"
    assert owners[(29.5, 34.5)] == "wasted_progress"
    assert owners[(39, 40)] == "checkpoint_restore"


def test_a_numerical_signal_the_controller_did_not_act_on_is_still_a_numerical_fault() -> None:
    """No decision (an operator restarted the job): the signal, a step before the run ended,
    is the outage's evidence all the same."""
    events = [e for e in nan_then_crash() if not isinstance(e, schemas.Decision)]
    report = compute_goodput(events)
    assert report.badput["numerical_rollback"] == pytest.approx(7.5, abs=1e-6)
    assert report.badput["wasted_progress"] == pytest.approx(5.0, abs=1e-6)


def test_the_job_seen_down_while_the_rollback_restarts_it_is_part_of_the_rollback() -> None:
    """The sensor's `job_down` (observed at the last step, before the NaN's own observation
    time here) while the rollback restarts the rank: the outage is still the NaN's rollback;
    the controller's answer to it (no command) moves no milestone."""
    down = schemas.Signal(
        job=JOB, ts=at(22), signal_id="sig-down", signal="job_down", observed_ts=at(18.0)
    )
    same = schemas.Decision(
        job=JOB, ts=at(22.5), signal_id="sig-down", policy="default", rule="same-incident",
        reason="the rollback's restart",
    )  # fmt: skip
    report = compute_goodput([*nan_then_crash(), down, same])
    for key, seconds in EXPECTED.items():
        assert report.badput[key] == pytest.approx(seconds, abs=1e-6), key
    assert report.failures[0].cause == "job_down, nonfinite"


def test_the_report_json_the_plot_and_the_metric_name_the_category(tmp_path) -> None:
    log = tmp_path / "run.jsonl"
    write_event_log(log, nan_then_crash())
    out = json.loads(goodput_cli("report", "--events", str(log), "--json").stdout)
    assert out["badput"]["numerical_rollback"] == pytest.approx(7.5)
    report = compute_goodput(nan_then_crash())
    page = write_html_report(report, tmp_path / "html").read_text()
    assert "<td>numerical rollback</td><td><code>numerical_rollback</code></td>" in page
    assert "numerical_rollback" in COLORS  # the timeline's band and the breakdown's bar
    reader = InMemoryMetricReader()
    gauges = metrics.GoodputGauges(MeterProvider([reader]))
    gauges.set(JOB, goodput=report.goodput_pct / 100, ettr=report.ettr, badput=report.badput)
    (data,) = reader.get_metrics_data().resource_metrics
    badput = {
        p.attributes[metrics.CAUSE]: p.value
        for scope in data.scope_metrics
        for metric in scope.metrics
        if metric.name == metrics.BADPUT
        for p in metric.data.data_points
    }
    assert badput["numerical_rollback"] == pytest.approx(7.5)
