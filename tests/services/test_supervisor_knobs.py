"""The knobs of Google's resiliency supervisor (``values-supervisor.yaml``) in a config file's
``[supervisor]`` table: each accepted name lands on its service's option through the real
config loader; an unknown, mistyped, unsupported or conflicting knob stops every service with
one line; and deploy/k8s/README.md documents exactly the names the alias table holds."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.service_health import read_records
from goodput.config import ServiceTables, convert_options, load_service_config
from goodput.config_aliases import ALIASES, REJECTED, Alias
from goodput_services.controller.options import ControllerOptions
from goodput_services.hostmon.options import HostMonitorOptions
from goodput_services.sensor.options import SensorOptions
from goodput_services.sensor.service import SensorService
from tests.conftest import refused_in_one_line
from tests.processes import stop
from tests.services.test_options import start_service

README = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "README.md"
SERVICES = list(ServiceTables.__struct_fields__)
#: the options struct of each service an alias sets
OPTIONS_TYPES: dict[str, type[msgspec.Struct]] = {
    "sensor": SensorOptions,
    "controller": ControllerOptions,
    "hostmon": HostMonitorOptions,
}
#: a value for each alias that is not its option's default, as the seed writes it (integers
#: for seconds)
SAMPLES: dict[type, tuple[str, Any]] = {float: ("42", 42.0), int: ("3", 3), bool: ("true", True)}


def option_of(options: msgspec.Struct, alias: Alias) -> Any:
    value: Any = options
    for key in alias.path:
        value = getattr(value, key)
    return value


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "goodput.toml"
    path.write_text(text)
    return str(path)


def loaded_options(service: str, path: str) -> msgspec.Struct:
    return convert_options(
        OPTIONS_TYPES[service], load_service_config(service, ["--config", path]).options, service
    )


def test_every_alias_names_a_service_with_options_here() -> None:
    assert {alias.service for alias in ALIASES.values()} <= set(OPTIONS_TYPES) <= set(SERVICES)
    assert not set(ALIASES) & set(REJECTED)


@pytest.mark.parametrize("name", list(ALIASES))
def test_an_alias_lands_on_its_services_option_and_nowhere_else(name: str, tmp_path: Path) -> None:
    alias = ALIASES[name]
    text, expected = SAMPLES[alias.kind]
    path = write_config(tmp_path, f"[supervisor]\n{name} = {text}\n")
    options = loaded_options(alias.service, path)
    assert (
        option_of(options, alias)
        == expected
        != option_of(convert_options(OPTIONS_TYPES[alias.service], {}, alias.service), alias)
    )
    for other in set(SERVICES) - {alias.service}:
        # the services that do not own it never see it (they reject keys they do not know)
        assert load_service_config(other, ["--config", path]).options == {}


def test_an_alias_merges_with_goodputs_own_options_of_the_same_service(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        "[supervisor]\nheartbeat_timeout_s = 30\n"
        "[services.sensor.thresholds]\njobset_downtime_threshold_s = 180\n",
    )
    thresholds = loaded_options("sensor", path).thresholds  # type: ignore[attr-defined]
    assert (thresholds.heartbeat_timeout_s, thresholds.jobset_downtime_threshold_s) == (30, 180)
    # --set flags still override the file, and set only the keys they name: the file's other
    # thresholds stay (a shallow merge once dropped them without a word)
    config = load_service_config(
        "sensor", ["--config", path, "--set", "thresholds={heartbeat_timeout_s=7.0}"]
    )
    assert config.options["thresholds"] == {
        "heartbeat_timeout_s": 7.0,
        "jobset_downtime_threshold_s": 180,
    }


def test_an_alias_keeps_the_shared_tables_other_keys(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        "[supervisor]\nheartbeat_timeout_s = 30\n[options.thresholds]\nhang_safety_factor = 4.0\n",
    )
    thresholds = loaded_options("sensor", path).thresholds  # type: ignore[attr-defined]
    assert (thresholds.heartbeat_timeout_s, thresholds.hang_safety_factor) == (30, 4.0)


def readme_example() -> str:
    section = README.read_text().split("### Coming from Google's resiliency supervisor", 1)[1]
    return section.split("```toml\n", 1)[1].split("```", 1)[0]


def test_the_readmes_example_reaches_every_service_it_names(tmp_path: Path) -> None:
    example = readme_example()
    path = write_config(tmp_path, example)
    values = tomllib.loads(example)["supervisor"]
    assert set(values) == set(ALIASES)
    for name, value in values.items():
        alias = ALIASES[name]
        assert option_of(loaded_options(alias.service, path), alias) == value


REFUSED = {
    "unknown key": ("[supervisor]\nheartbeat_period_s = 1\n", "unknown [supervisor] key"),
    "wrong type": (
        '[supervisor]\nenable_fault_injection = "yes"\n',
        "enable_fault_injection: Expected `bool`, got `str`",
    ),
    "integer flag": ("[supervisor]\nenable_fault_injection = 1\n", "Expected `bool`"),
    "fractional count": ("[supervisor]\nnum_nodes_per_dp = 2.5\n", "Expected `int`"),
    "no equivalent": ("[supervisor]\nnum_dp_replicas = 4\n", "goodput run --nodes"),
    "host daemon": (
        '[supervisor.host_daemon]\nport = 60010\ncommand = "host_daemon.py"\n',
        "[services.hostmon]",
    ),
    "set twice": (
        "[supervisor]\nheartbeat_timeout_s = 30\n"
        "[services.sensor.thresholds]\nheartbeat_timeout_s = 20\n",
        "[supervisor] heartbeat_timeout_s and [services.sensor.thresholds] heartbeat_timeout_s "
        "set the same option",
    ),
    "set twice, shared table": (
        "[supervisor]\nnum_nodes_per_dp = 2\n[options]\nnum_nodes_per_dp = 2\n",
        "[options] num_nodes_per_dp set the same option",
    ),
    "not a table": ("supervisor = 3\n", "[supervisor] must be a table"),
    "service not a table": (
        "[supervisor]\nheartbeat_timeout_s = 30\n[services]\nsensor = 3\n",
        "[services.sensor] must be a table",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("service", SERVICES)
def test_a_refused_knob_stops_every_service_in_one_line(
    case: str, service: str, tmp_path: Path
) -> None:
    text, words = REFUSED[case]
    path = write_config(tmp_path, text)
    with pytest.raises(SystemExit) as refused:
        load_service_config(service, ["--config", path])
    message = str(refused.value.code)
    assert message.startswith(f"invalid config file {path}: ") and words in message, message
    assert "\n" not in message


@pytest.mark.parametrize("name", list(REJECTED))
def test_a_knob_without_equivalent_says_what_to_use_instead(name: str, tmp_path: Path) -> None:
    path = write_config(tmp_path, f"[supervisor.{name}]\nport = 60010\n")
    with pytest.raises(SystemExit) as refused:
        load_service_config("sensor", ["--config", path])
    message = str(refused.value.code)
    assert message.endswith(f"[supervisor] {name} has no goodput equivalent: {REJECTED[name]}")
    assert "\n" not in message


def test_every_problem_of_the_table_is_named_at_once(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[supervisor]\nnum_dp_replicas = 4\nverbosity = 2\n")
    with pytest.raises(SystemExit, match=r"num_dp_replicas.*; unknown .* 'verbosity'"):
        load_service_config("sensor", ["--config", path])


def test_a_rejected_knob_stops_a_real_service_process_with_one_line(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[supervisor]\nnum_dp_replicas = 4\n")
    result = start_service("controller", "--config", path)
    refused_in_one_line(result, "num_dp_replicas", "goodput run --nodes")


def test_a_value_the_option_refuses_names_goodputs_option(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[supervisor]\nheartbeat_timeout_s = -30\n")
    result = start_service("sensor", "--config", path)
    refused_in_one_line(result, "heartbeat_timeout_s", "positive")


async def test_a_sensor_started_with_the_seeds_knobs_is_healthy_with_them(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    job = "job-knobs"
    path = write_config(tmp_path, f'job = "{job}"\n{readme_example()}')
    config = load_service_config("sensor", ["--config", path, "--state-dir", str(tmp_path)])
    thresholds = SensorService(config).thresholds
    assert (thresholds.heartbeat_polling_period_s, thresholds.heartbeat_timeout_s) == (15, 30)
    assert (thresholds.pod_termination_threshold_s, thresholds.jobset_downtime_threshold_s) == (
        60,
        180,
    )
    log = tmp_path / "sensor.log"
    sensor = subprocess.Popen(
        [sys.executable, "-m", "goodput_services.sensor", "--config", path,
         "--nats-url", nats_server.url, "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )  # fmt: skip
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    try:
        await bus.provision()
        deadline = time.monotonic() + 120
        record = None
        while time.monotonic() < deadline and sensor.poll() is None:
            records, _ = await read_records(bus, job, "sensor")
            record = records[0] if records else None
            if record is not None and record.healthy:
                break
            await asyncio.sleep(0.2)
        assert sensor.poll() is None, log.read_text()
        assert record is not None and record.healthy, record
    finally:
        await bus.close()
        stop(sensor, timeout_s=60)


def readme_rows() -> dict[str, list[str]]:
    """The README's knob table: knob name -> its cells."""
    section = README.read_text().split("### Coming from Google's resiliency supervisor", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| `(\w+)` \|(.*)\|", line)
        if match:
            rows[match[1]] = [cell.strip() for cell in match[2].split(" | ")]
    return rows


def test_the_k8s_readme_documents_exactly_the_alias_table() -> None:
    rows = readme_rows()
    assert set(rows) == set(ALIASES) | set(REJECTED)
    for name, alias in ALIASES.items():
        option, service, default, difference = rows[name]
        assert option == f"`{alias.where(f'services.{alias.service}')}`", name
        assert service == alias.service, name
        defaults = convert_options(OPTIONS_TYPES[alias.service], {}, alias.service)
        assert tomllib.loads(f"v = {default.strip('`')}")["v"] == option_of(defaults, alias)
        assert difference, name
    for name in REJECTED:
        assert rows[name][0].startswith("rejected"), name
