"""The rank's part of a remediation's trace, and its training metrics.

The actuator launches ranks with the launch span's context in ``GOODPUT_TRACEPARENT``. A rank
continues that trace with one span, from the shim's start through restoring the checkpoint
to its first step; it ends when the first ``StepDone`` is published, and that event carries
the span's context, so "training resumed" closes the remediation's trace.

Exporters come from the standard ``OTEL_*`` variables, as in the services (a Prometheus
endpoint on the base port plus the local rank). A training script
that installed its own OpenTelemetry providers keeps them; with no exporter chosen nothing is
installed at all, and the trace still passes through (the API's no-op span keeps its parent's
context), so the first step's event still belongs to the remediation.
"""

from __future__ import annotations

from opentelemetry import context, metrics, trace

from goodput import schemas
from goodput.launch.rank_env import RankEnv
from goodput.measure.metrics import JOB, NODE, RANK, TrainingMetrics
from goodput.telemetry import (
    context_from_traceparent,
    exporter_choice,
    setup_metrics,
    setup_tracing,
    tracer,
)

SERVICE_NAME = "goodput-trainer"
RESUME_SPAN = "trainer restore and first step"


class ShimTelemetry:
    """Ends the resume span at the first step; records step and checkpoint-stall metrics."""

    def __init__(
        self,
        *,
        job: str,
        node: str,
        rank: int,
        attempt: int,
        traceparent: str = "",
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        attributes: dict[str, str | int] = {JOB: job, NODE: node, RANK: rank}
        self.metrics = TrainingMetrics(attributes, meter_provider)
        self.span: trace.Span | None = None
        if traceparent:
            self.span = tracer("goodput.trainer").start_span(
                RESUME_SPAN,
                context=context_from_traceparent(traceparent),
                attributes={**attributes, "goodput.attempt": attempt},
            )

    @classmethod
    def from_env(
        cls, *, job: str, node: str, rank: int, attempt: int, local_rank: int = 0
    ) -> ShimTelemetry:
        """Set up exporters the environment asks for, and continue the launch's trace.

        A Prometheus endpoint is served on the base port plus ``local_rank``: the ranks of a
        node each have their own.
        """
        if exporter_choice("OTEL_TRACES_EXPORTER") != "none":
            setup_tracing(SERVICE_NAME)
        setup_metrics(SERVICE_NAME, port_offset=local_rank)
        return cls(
            job=job,
            node=node,
            rank=rank,
            attempt=attempt,
            traceparent=RankEnv.from_env().traceparent,
        )

    def context(self) -> context.Context | None:
        """The context events are published in: the resume span's while it is open."""
        return trace.set_span_in_context(self.span) if self.span is not None else None

    def observe(self, event: schemas.Event) -> None:
        """Called with every event the rank publishes, after it was handed to the bus link."""
        match event:
            case schemas.StepDone():
                self.metrics.step(event.step_time_s)
                if self.span is not None:
                    self.span.set_attribute("goodput.first_step", event.step)
                    self.span.end()
                    self.span = None
            case schemas.CheckpointSaved():
                self.metrics.checkpoint_stall(event.stall_s)
            case schemas.CheckpointRestored() if self.span is not None:
                self.span.set_attribute("goodput.restored_step", event.step)
                self.span.set_attribute("goodput.restore_s", event.duration_s)
