"""The address a replicator tells its peers: the option, else $GOODPUT_ADVERTISE_HOST, else
the listening address; never one no peer could use (issue 37)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.launch.exit_reason import REFUSED_EXIT_CODE
from goodput_services.replicator.options import (
    ADVERTISE_HOST_ENV,
    ReplicatorOptions,
    advertised_host,
)

REMOTE_BUS = ["nats-0.example.net"]
LOCAL_BUS = ["127.0.0.1"]


def _options(**values: object) -> ReplicatorOptions:
    return ReplicatorOptions.from_mapping(values)


def test_the_option_wins_over_the_environment_which_wins_over_the_listener() -> None:
    env = {ADVERTISE_HOST_ENV: "10.8.3.17"}
    wildcard = _options(host="0.0.0.0", port=7450)
    assert advertised_host(wildcard, env, REMOTE_BUS) == "10.8.3.17"
    explicit = _options(host="0.0.0.0", advertise_host="10.9.0.1")
    assert advertised_host(explicit, env, REMOTE_BUS) == "10.9.0.1"
    assert advertised_host(_options(host="10.1.2.3"), {}, REMOTE_BUS) == "10.1.2.3"
    # one machine: the default loopback listener with the embedded (loopback) bus
    assert advertised_host(_options(), {}, LOCAL_BUS) == "127.0.0.1"
    assert advertised_host(_options(), {}, [""]) == "127.0.0.1"


@pytest.mark.parametrize("advertised", ["127.0.0.1", "localhost", "::1", "127.0.1.1"])
def test_a_loopback_advertisement_with_a_remote_bus_is_refused(advertised: str) -> None:
    """Peers on other hosts would connect to themselves."""
    options = _options(host="0.0.0.0")
    with pytest.raises(SystemExit, match=r"loopback address .* peers would connect to themselves"):
        advertised_host(options, {ADVERTISE_HOST_ENV: advertised}, REMOTE_BUS)
    # one remote server among loopback ones is enough: the bus spans hosts
    with pytest.raises(SystemExit, match="loopback"):
        advertised_host(options, {ADVERTISE_HOST_ENV: advertised}, [*LOCAL_BUS, *REMOTE_BUS])


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_wildcard_listener_with_nothing_to_advertise_is_refused(host: str) -> None:
    with pytest.raises(SystemExit, match=r"would advertise .*set advertise_host"):
        advertised_host(_options(host=host), {ADVERTISE_HOST_ENV: "  "}, LOCAL_BUS)


def test_an_ipv6_advertisement_needs_a_listener_that_takes_ipv6() -> None:
    env = {ADVERTISE_HOST_ENV: "fd00:10::17"}
    with pytest.raises(SystemExit, match=re.escape('IPv4 address 0.0.0.0: set host = "::"')):
        advertised_host(_options(host="0.0.0.0"), env, REMOTE_BUS)
    assert advertised_host(_options(host="::"), env, REMOTE_BUS) == "fd00:10::17"


def test_the_replicator_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    """No advertise host, the default loopback listener, a bus on another host: the process
    exits as refused before connecting anywhere, its reason the last line."""
    run = subprocess.run(
        [
            *(sys.executable, "-m", "goodput_services.replicator", "--node", "node-0"),
            *("--nats-url", "nats://203.0.113.9:4222", "--insecure"),
            *("--state-dir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    assert run.returncode == REFUSED_EXIT_CODE, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("replicator: the peer data plane would advertise the loopback")
    assert "203.0.113.9" in last and "Traceback" not in run.stderr
