"""The goodput metrics, through the OpenTelemetry metrics API: names and units in one place.

Step rate and checkpoint stall are recorded where they happen (the trainer shim, inside each
rank); the goodput ratio and the badput by cause are known where the accounting runs over a
job's events (``goodput report``), so that process records them. Without a meter provider
(``OTEL_METRICS_EXPORTER`` unset) every instrument is the API's no-op.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from goodput import schemas

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
#: gauge: time lost to each badput cause over the report's window (s), keyed by ``CAUSE``
BADPUT = "goodput.job.badput"

#: counter, from the sensor: steps the job's newest completed step advanced while it watched;
#: its rate is the job's step rate in one series (a step re-run after a rollback is not
#: counted again)
JOB_STEPS = "goodput.job.steps"
#: counter, from the sensor: the fault signals it raised, by ``SIGNAL`` kind
SIGNALS = "goodput.sensor.signals"

#: attribute names; a cause is a key of :mod:`goodput.measure.accounting.categories`
JOB, NODE, RANK, CAUSE = "goodput.job", "goodput.node", "goodput.rank", "goodput.cause"
SIGNAL = "goodput.signal"


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


class JobProgressMetrics:
    """The job's step progress and fault signals as the sensor sees them: one series per job
    (and signal kind), however many ranks report, at O(1) per event."""

    def __init__(self, job: str, provider: metrics.MeterProvider | None = None):
        meter = _meter(provider)
        self.attributes = {JOB: job}
        self.newest_step: int | None = None
        self.steps = meter.create_counter(
            JOB_STEPS, unit="{step}", description="steps the job's newest step advanced"
        )
        self.signals = meter.create_counter(
            SIGNALS, unit="{signal}", description="fault signals raised"
        )

    def observe(self, event: schemas.Event) -> None:
        """A job event as the sensor receives it; a new run counts from its own first step."""
        match event:
            case schemas.RunStarted():
                self.newest_step = None
            case schemas.StepDone():
                if self.newest_step is None:
                    self.newest_step = event.step  # a sensor started mid-job counts from here
                elif event.step > self.newest_step:
                    self.steps.add(event.step - self.newest_step, self.attributes)
                    self.newest_step = event.step

    def signal(self, kind: str) -> None:
        self.signals.add(1, {**self.attributes, SIGNAL: kind})


class GoodputGauges:
    """The latest goodput, ETTR and badput by cause of each job this process computed, as
    observable gauges."""

    def __init__(self, provider: metrics.MeterProvider | None = None):
        self.values: dict[str, tuple[float, float]] = {}
        self.badput: dict[str, dict[str, float]] = {}
        meter = _meter(provider)
        meter.create_observable_gauge(
            GOODPUT, callbacks=[self._goodput], unit="1", description="productive / total time"
        )
        meter.create_observable_gauge(
            ETTR, callbacks=[self._ettr], unit="1", description="productive / scheduled time"
        )
        meter.create_observable_gauge(
            BADPUT, callbacks=[self._badput], unit="s", description="time lost, by cause"
        )

    def set(
        self, job: str, *, goodput: float, ettr: float, badput: Mapping[str, float] | None = None
    ) -> None:
        self.values[job] = (goodput, ettr)
        self.badput[job] = dict(badput or {})

    def _goodput(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(g, {JOB: job}) for job, (g, _) in self.values.items()]

    def _ettr(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(e, {JOB: job}) for job, (_, e) in self.values.items()]

    def _badput(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(seconds, {JOB: job, CAUSE: cause})
            for job, causes in self.badput.items()
            for cause, seconds in causes.items()
        ]
