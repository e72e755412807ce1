"""Service options are typed: a typo, a wrong type or a refused value stops a real service
process at start-up with one line naming the field, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from goodput.config import convert_options
from goodput_services.actuator.options import ActuatorOptions
from goodput_services.controller.options import ControllerOptions
from goodput_services.hostmon.options import HostMonitorOptions
from goodput_services.sensor.options import SensorOptions
from tests.conftest import refused_in_one_line

#: nothing listens here: a service that got past its options would fail on the bus instead
NO_BUS = "nats://127.0.0.1:1"


def start_service(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"goodput_services.{name}", "--nats-url", NO_BUS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_wrong_typed_sensor_threshold_in_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "sensor.toml"
    config.write_text('[options.thresholds]\nheartbeat_timeout_s = "five"\n')
    result = start_service("sensor", "--config", str(config))
    refused_in_one_line(result, "invalid sensor option", "heartbeat_timeout_s")


def test_negative_sensor_threshold(tmp_path: Path) -> None:
    result = start_service("sensor", "--set", "thresholds={hang_safety_factor=-1.0}")
    refused_in_one_line(result, "hang_safety_factor", "positive")


def test_a_typo_in_a_controller_option() -> None:
    result = start_service("controller", "--set", "lease_tll_s=3")
    refused_in_one_line(result, "invalid controller option", "lease_tll_s")


def test_a_missing_policy_script_stops_the_controller(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_policy.py"
    result = start_service("controller", "--set", f'policy="{missing}"')
    refused_in_one_line(result, str(missing))


def test_an_unknown_actuator_backend() -> None:
    result = start_service("actuator", "--set", 'backend="k8s"')
    refused_in_one_line(result, "invalid actuator option", "backend")


def test_a_zero_host_monitor_interval() -> None:
    result = start_service("hostmon", "--node", "node-0", "--set", "probe_interval_s=0")
    refused_in_one_line(result, "invalid hostmon option", "probe_interval_s")


@pytest.mark.parametrize(
    "options_type", [SensorOptions, ControllerOptions, ActuatorOptions, HostMonitorOptions]
)
def test_every_options_struct_has_defaults_and_rejects_unknown_fields(options_type) -> None:
    assert isinstance(convert_options(options_type, {}, "svc"), msgspec.Struct)
    with pytest.raises(SystemExit, match="unknown field `nope`"):
        convert_options(options_type, {"nope": 1}, "svc")


def test_options_convert_nested_tables() -> None:
    options = convert_options(
        ControllerOptions,
        {"policy": "p.py", "settings": {"policy_timeout_s": 5.0}, "num_nodes_per_dp": 2},
        "controller",
    )
    assert (options.policy, options.settings.policy_timeout_s) == ("p.py", 5.0)
    assert options.num_nodes_per_dp == 2


@pytest.mark.parametrize(
    ("name", "role"), [("hostmon", "host monitor"), ("replicator", "replicator")]
)
def test_a_per_node_service_without_its_node_is_refused_in_one_line(name, role) -> None:
    result = start_service(name)
    refused_in_one_line(result, f"the {role} serves one node", "--node NAME")
