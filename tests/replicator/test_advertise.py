"""The address a replicator tells its peers: the option, else $GOODPUT_ADVERTISE_HOST, else
the listening address; never one no peer could use (issue 37)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.checkpoint.tiers.peer.address import (
    ADVERTISE_HOST_ENV,
    AddressError,
    advertised_host,
    one_machine_env,
)
from goodput.launch.exit_reason import REFUSED_EXIT_CODE

REMOTE_BUS = ["nats-0.example.net"]
LOCAL_BUS = ["127.0.0.1"]


def test_the_option_wins_over_the_environment_which_wins_over_the_listener() -> None:
    env = {ADVERTISE_HOST_ENV: "10.8.3.17"}
    assert advertised_host("0.0.0.0", "", env, REMOTE_BUS) == "10.8.3.17"
    assert advertised_host("0.0.0.0", "10.9.0.1", env, REMOTE_BUS) == "10.9.0.1"
    assert advertised_host("10.1.2.3", "", {}, REMOTE_BUS) == "10.1.2.3"
    # one machine: the default loopback listener with the embedded (loopback) bus
    assert advertised_host("127.0.0.1", "", {}, LOCAL_BUS) == "127.0.0.1"
    assert advertised_host("127.0.0.1", "", {}, [""]) == "127.0.0.1"


@pytest.mark.parametrize("advertised", ["127.0.0.1", "localhost", "::1", "127.0.1.1"])
def test_a_loopback_advertisement_with_a_remote_bus_is_refused(advertised: str) -> None:
    """Not named by the operator, it came from the listener: peers on other hosts would
    connect to themselves."""
    with pytest.raises(
        AddressError, match=r"loopback address .* peers would connect to themselves"
    ):
        advertised_host(advertised, "", {}, REMOTE_BUS)
    # one remote server among loopback ones is enough: the bus spans hosts
    with pytest.raises(AddressError, match="loopback"):
        advertised_host(advertised, "", {}, [*LOCAL_BUS, *REMOTE_BUS])


def test_a_loopback_address_the_operator_names_is_taken() -> None:
    """Every replicator on one machine with a bus elsewhere (`goodput up --nats-url`): the
    launcher names loopback, unless its environment names an address already."""
    env = one_machine_env({})
    assert env == {ADVERTISE_HOST_ENV: "127.0.0.1"}
    assert advertised_host("127.0.0.1", "", env, REMOTE_BUS) == "127.0.0.1"
    assert advertised_host("127.0.0.1", "127.0.0.1", {}, REMOTE_BUS) == "127.0.0.1"
    assert one_machine_env({ADVERTISE_HOST_ENV: "10.8.3.17"}) == {}


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_wildcard_listener_with_nothing_to_advertise_is_refused(host: str) -> None:
    with pytest.raises(AddressError, match=r"would advertise .*set advertise_host"):
        advertised_host(host, "", {ADVERTISE_HOST_ENV: "  "}, LOCAL_BUS)


def test_an_ipv6_advertisement_needs_a_listener_that_takes_ipv6() -> None:
    env = {ADVERTISE_HOST_ENV: "fd00:10::17"}
    with pytest.raises(AddressError, match=re.escape('IPv4 address 0.0.0.0: set host = "::"')):
        advertised_host("0.0.0.0", "", env, REMOTE_BUS)
    assert advertised_host("::", "", env, REMOTE_BUS) == "fd00:10::17"


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
