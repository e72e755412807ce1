"""Thresholds are valid by construction: NaN, infinity and non-positive values are refused
wherever they come from, and a refused update leaves the thresholds in force (issue 28 item 9).
"""

from __future__ import annotations

import asyncio
import math

import msgspec
import pytest

from goodput import schemas
from goodput.config import ServiceConfig
from goodput.supervisor.detect.detector import Detector
from goodput.supervisor.detect.thresholds import Thresholds, updated
from goodput_services.sensor.options import SensorOptions
from goodput_services.sensor.service import SensorService

from .synthetic import JOB

BAD = [
    {"heartbeat_timeout_s": math.nan},
    {"hang_min_timeout_s": math.inf},
    {"checkpoint_timeout_s": -math.inf},
    {"straggler_ratio": 0.0},
    {"interval_decay": 1.5},
]


@pytest.mark.parametrize("values", BAD)
def test_a_bad_value_is_refused_by_every_door(values: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        updated(Thresholds(), values)
    with pytest.raises(ValueError):
        Thresholds(**values)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"thresholds": values}, SensorOptions)
    with pytest.raises(ValueError):
        msgspec.structs.replace(Thresholds(), **values)


def test_the_sensor_refuses_nan_and_inf_and_keeps_what_it_had(tmp_path) -> None:
    sensor = SensorService(ServiceConfig(job=JOB, state_dir=str(tmp_path)))

    def command(**values: float) -> tuple[bool, str]:
        return asyncio.run(sensor.execute(schemas.SetThresholds(job=JOB, values=values)))

    assert command(heartbeat_timeout_s=2.0)[0]
    before = sensor.thresholds
    for values in BAD:
        ok, why = command(**values)
        assert not ok and next(iter(values)) in why, why
        assert "\n" not in why
        assert sensor.thresholds == before
    assert sensor.thresholds.heartbeat_timeout_s == 2.0


def test_thresholds_cannot_be_changed_behind_validation() -> None:
    detector = Detector(JOB)
    with pytest.raises(AttributeError):
        detector.thresholds.heartbeat_timeout_s = math.nan  # type: ignore[misc]
