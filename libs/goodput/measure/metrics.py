"""The goodput metrics, through the OpenTelemetry metrics API: names and units in one place.

Step rate and checkpoint stall are recorded where they happen (the trainer shim, inside each
rank); the goodput ratio is known where the accounting runs over a job's events (``goodput
report``), so that process records it. Without a meter provider (``OTEL_METRICS_EXPORTER``
unset) every instrument is the API's no-op.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

#: counter of completed training steps; its rate is the step rate
STEPS = "goodput.train.steps"
#: histogram of wall time per step (s)
STEP_TIME = "goodput.train.step_time"
#: histogram of training time lost to a checkpoint save (the snapshot stall, s)
CHECKPOINT_STALL = "goodput.checkpoint.stall"
#: gauge: productive time / total time of a job (0..1)
GOODPUT = "goodput.job.goodput"
#: gauge: effective training time ratio, productive / (total - job down) (0..1)
ETTR = "goodput.job.ettr"

#: attribute names
JOB, NODE, RANK = "goodput.job", "goodput.node", "goodput.rank"


def _meter(provider: metrics.MeterProvider | None) -> metrics.Meter:
    return (provider or metrics.get_meter_provider()).get_meter("goodput")


class TrainingMetrics:
    """Step and checkpoint-stall instruments of one rank."""

    def __init__(
        self, attributes: dict[str, str | int], provider: metrics.MeterProvider | None = None
    ):
        meter = _meter(provider)
        self.attributes = attributes
        self.steps = meter.create_counter(STEPS, unit="{step}", description="training steps done")
        self.step_time = meter.create_histogram(
            STEP_TIME, unit="s", description="wall time of one training step"
        )
        self.stall = meter.create_histogram(
            CHECKPOINT_STALL, unit="s", description="training time lost to a checkpoint save"
        )

    def step(self, step_time_s: float) -> None:
        self.steps.add(1, self.attributes)
        if step_time_s > 0:
            self.step_time.record(step_time_s, self.attributes)

    def checkpoint_stall(self, stall_s: float) -> None:
        self.stall.record(max(stall_s, 0.0), self.attributes)


class GoodputGauges:
    """The latest goodput and ETTR of each job this process computed, as observable gauges."""

    def __init__(self, provider: metrics.MeterProvider | None = None):
        self.values: dict[str, tuple[float, float]] = {}
        meter = _meter(provider)
        meter.create_observable_gauge(
            GOODPUT, callbacks=[self._goodput], unit="1", description="productive / total time"
        )
        meter.create_observable_gauge(
            ETTR, callbacks=[self._ettr], unit="1", description="productive / scheduled time"
        )

    def set(self, job: str, *, goodput: float, ettr: float) -> None:
        self.values[job] = (goodput, ettr)

    def _goodput(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g, {JOB: job}) for job, (g, _) in self.values.items()]

    def _ettr(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(e, {JOB: job}) for job, (_, e) in self.values.items()]
