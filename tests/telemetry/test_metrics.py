"""Metrics through the OpenTelemetry API, the shim's resume span, and exporter selection."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, InMemoryMetricReader
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from goodput import schemas, telemetry
from goodput.measure import metrics
from goodput.measure.accounting import write_event_log
from goodput.shim.tracing import RESUME_SPAN, ShimTelemetry
from goodput.telemetry import metric_exporter_from_env, span_exporter_from_env
from tests.accounting.scenario import scenario_events

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
LAUNCH_SPAN_ID = "00f067aa0ba902b7"


def points(reader: InMemoryMetricReader) -> dict[str, list]:
    """Data points per metric name, from one collection."""
    data = reader.get_metrics_data()
    found: dict[str, list] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_steps_step_time_and_checkpoint_stall_are_recorded() -> None:
    reader = InMemoryMetricReader()
    recorded = metrics.TrainingMetrics({metrics.JOB: "j", metrics.RANK: 0}, MeterProvider([reader]))
    recorded.step(0.25)
    recorded.step(0.75)
    recorded.checkpoint_stall(0.1)
    found = points(reader)
    (steps,) = found[metrics.STEPS]
    assert steps.value == 2 and dict(steps.attributes) == {metrics.JOB: "j", metrics.RANK: 0}
    (step_time,) = found[metrics.STEP_TIME]
    assert step_time.count == 2 and step_time.sum == pytest.approx(1.0)
    (stall,) = found[metrics.CHECKPOINT_STALL]
    assert stall.count == 1 and stall.sum == pytest.approx(0.1)


def test_goodput_gauges_report_the_latest_value_per_job() -> None:
    reader = InMemoryMetricReader()
    gauges = metrics.GoodputGauges(MeterProvider([reader]))
    gauges.set("a", goodput=0.5, ettr=0.6, badput={"restart_reprovision": 30.0})
    gauges.set("a", goodput=0.9, ettr=0.95, badput={"checkpoint_save": 2.0, "job_down": 7.0})
    gauges.set("b", goodput=0.1, ettr=0.2)
    found = points(reader)
    goodput = {p.attributes[metrics.JOB]: p.value for p in found[metrics.GOODPUT]}
    ettr = {p.attributes[metrics.JOB]: p.value for p in found[metrics.ETTR]}
    assert goodput == {"a": 0.9, "b": 0.1} and ettr == {"a": 0.95, "b": 0.2}
    badput = {
        (p.attributes[metrics.JOB], p.attributes[metrics.CAUSE]): p.value
        for p in found[metrics.BADPUT]
    }
    assert badput == {("a", "checkpoint_save"): 2.0, ("a", "job_down"): 7.0}


def test_the_job_step_counter_counts_the_newest_step_once_and_each_run_from_its_start() -> None:
    reader = InMemoryMetricReader()
    progress = metrics.JobProgressMetrics("j", MeterProvider([reader]))

    def step(rank: int, step: int) -> schemas.StepDone:
        return schemas.StepDone(
            job="j", node="n0", rank=rank, step=step, step_time_s=0.1, tokens=1, loss=1.0
        )

    for event in [step(0, 10), step(1, 10), step(0, 11), step(1, 11), step(0, 13)]:
        progress.observe(event)  # a sensor started mid-job: counted from step 10
    for event in [step(0, 12), step(0, 13), step(0, 14)]:  # a rollback re-runs 12 and 13
        progress.observe(event)
    progress.observe(schemas.RunStarted(job="j", run_id="r2", command_id="c2"))
    for event in [step(0, 1), step(0, 2), step(0, 3)]:  # a new run counts from its own start
        progress.observe(event)
    progress.signal("crash")
    progress.signal("crash")
    progress.signal("hang")
    found = points(reader)
    (steps,) = found[metrics.JOB_STEPS]
    assert steps.value == (14 - 10) + (3 - 1) and dict(steps.attributes) == {metrics.JOB: "j"}
    signals = {p.attributes[metrics.SIGNAL]: p.value for p in found[metrics.SIGNALS]}
    assert signals == {"crash": 2, "hang": 1}


def test_the_shim_continues_the_launch_trace_until_its_first_step(
    spans: InMemorySpanExporter,
) -> None:
    reader = InMemoryMetricReader()
    telemetry = ShimTelemetry(
        job="j",
        node="n0",
        rank=1,
        attempt=2,
        traceparent=f"00-{TRACE_ID}-{LAUNCH_SPAN_ID}-01",
        meter_provider=MeterProvider([reader]),
    )
    assert telemetry.context() is not None  # events published now carry the resume span
    common = {"job": "j", "node": "n0", "rank": 1}
    telemetry.observe(schemas.CheckpointRestored(**common, step=4, tier="local", duration_s=0.5))
    telemetry.observe(schemas.StepDone(**common, step=5, step_time_s=0.2, tokens=1, loss=1.0))
    telemetry.observe(schemas.StepDone(**common, step=6, step_time_s=0.2, tokens=1, loss=1.0))
    telemetry.observe(schemas.CheckpointSaved(**common, step=6, stall_s=0.05, bytes=10))
    assert telemetry.context() is None  # later events belong to no remediation

    (span,) = [s for s in spans.get_finished_spans() if s.name == RESUME_SPAN]
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None and f"{span.parent.span_id:016x}" == LAUNCH_SPAN_ID
    assert span.attributes["goodput.restored_step"] == 4
    assert span.attributes["goodput.first_step"] == 5
    assert span.attributes["goodput.attempt"] == 2
    found = points(reader)
    assert found[metrics.STEPS][0].value == 2
    assert found[metrics.CHECKPOINT_STALL][0].sum == pytest.approx(0.05)


def test_a_rank_launched_outside_a_trace_has_no_resume_span(spans: InMemorySpanExporter) -> None:
    telemetry = ShimTelemetry(job="j", node="n0", rank=0, attempt=1)
    assert telemetry.context() is None
    telemetry.observe(
        schemas.StepDone(job="j", node="n0", rank=0, step=1, step_time_s=0.1, tokens=1, loss=1.0)
    )
    assert not [s for s in spans.get_finished_spans() if s.name == RESUME_SPAN]


@pytest.mark.parametrize(
    ("value", "spans_to", "metrics_to"),
    [
        (None, type(None), type(None)),
        ("none", type(None), type(None)),
        ("console", ConsoleSpanExporter, ConsoleMetricExporter),
        (" OTLP ", OTLPSpanExporter, OTLPMetricExporter),
    ],
)
def test_exporters_follow_the_standard_environment_variables(
    monkeypatch: pytest.MonkeyPatch, value: str | None, spans_to: type, metrics_to: type
) -> None:
    for variable in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    assert isinstance(span_exporter_from_env(), spans_to)
    assert isinstance(metric_exporter_from_env(), metrics_to)


def _report_of_a_scenario(tmp_path: Path, exporter: str) -> subprocess.CompletedProcess:
    """``goodput report --json`` of the scenario's event log, metrics to ``exporter``."""
    log = tmp_path / "events.jsonl"
    write_event_log(log, scenario_events())
    return subprocess.run(
        [sys.executable, "-m", "goodput.tools.cli.main", "report", "--events", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OTEL_METRICS_EXPORTER": exporter},
        check=True,
    )


def test_goodput_report_exports_the_goodput_gauge_with_the_console_exporter(
    tmp_path: Path,
) -> None:
    result = _report_of_a_scenario(tmp_path, "console")
    decoder, values, badput, offset = json.JSONDecoder(), {}, {}, 0
    while (start := result.stdout.find("{", offset)) >= 0:
        document, offset = decoder.raw_decode(result.stdout, start)
        for resource in document.get("resource_metrics", []):
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    data_points = metric["data"]["data_points"]
                    values[metric["name"]] = data_points[0]["value"]
                    if metric["name"] == metrics.BADPUT:
                        badput = {p["attributes"][metrics.CAUSE]: p["value"] for p in data_points}
        if "goodput_pct" in document:
            report = document
    assert values[metrics.GOODPUT] == pytest.approx(report["goodput_pct"] / 100)
    assert values[metrics.ETTR] == pytest.approx(report["ettr"])
    assert badput == pytest.approx({k: v for k, v in report["badput"].items()})
    assert badput["restart_reprovision"] > 0


def test_goodput_report_under_the_prometheus_exporter_says_in_one_line_where_its_gauges_go(
    tmp_path: Path,
) -> None:
    result = _report_of_a_scenario(tmp_path, "prometheus")
    (line,) = result.stderr.strip().splitlines()
    assert "Prometheus" in line and "OTEL_METRICS_EXPORTER=otlp" in line
    assert json.loads(result.stdout)["goodput_pct"] > 0


def test_a_metrics_exporter_goodput_does_not_know_is_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp,prometheus")
    with caplog.at_level(logging.WARNING, logger="goodput.telemetry"):
        assert telemetry.metric_reader_from_env(0) is None
    (record,) = caplog.records
    assert "'otlp,prometheus'" in record.getMessage() and "prometheus" in record.getMessage()
    caplog.clear()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert telemetry.metric_reader_from_env(0) is None and not caplog.records
