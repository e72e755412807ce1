"""Where peers reach a node's data plane: the address a replicator announces in the index.

The address comes from ``advertise_host``, else ``$GOODPUT_ADVERTISE_HOST`` (on Kubernetes the
pod's IP, from the downward API's ``status.podIP``), else the listening host. An address no
peer could use stops the replicator at start, in one line: a wildcard, an IPv6 address behind
an IPv4-only listener, or a loopback address the operator did not name while the bus is on
another host. Refused rather than warned: with the fixed port of a deployment, a peer told
"127.0.0.1" connects to its own replicator, which the job's key admits, so the "replica" would
land on the node it is meant to outlive. A launcher that runs every node on one machine
(``goodput up``) names loopback itself (:func:`one_machine_env`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

from goodput.bus.settings import is_loopback

ADVERTISE_HOST_ENV = "GOODPUT_ADVERTISE_HOST"
#: the peer data plane's port where a deployment fixes one (every host the same: the
#: Kubernetes manifests' ``containerPort``, a node agent's replicator)
PEER_PORT = 7450
#: what the replicators of one machine tell each other
LOOPBACK = "127.0.0.1"


class AddressError(ValueError):
    """No peer could reach the address a replicator would announce (one line)."""


def advertised_host(
    listen_host: str, advertise_host: str, env: Mapping[str, str], bus_hosts: Sequence[str]
) -> str:
    """The address to announce (module docstring); :class:`AddressError` when unusable."""
    named = advertise_host or env.get(ADVERTISE_HOST_ENV, "").strip()
    host = named or listen_host
    how = (
        f"set advertise_host (or ${ADVERTISE_HOST_ENV}; on Kubernetes from status.podIP) to an "
        "address the other nodes reach"
    )
    address = _ip(host)
    if host == "" or (address is not None and address.is_unspecified):
        raise AddressError(f"the peer data plane would advertise {host!r}: {how}")
    remote = [bus for bus in bus_hosts if not is_loopback(bus)]
    if remote and is_loopback(host) and not named:
        raise AddressError(
            f"the peer data plane would advertise the loopback address {host} while the bus "
            f"({', '.join(remote)}) is on another host: peers would connect to themselves; "
            f'{how} (or advertise_host = "{LOOPBACK}" if every replicator runs on this host)'
        )
    listener = _ip(listen_host)
    ipv6 = address is not None and address.version == 6
    if ipv6 and listener is not None and listener.version == 4:
        raise AddressError(
            f"the peer data plane advertises the IPv6 address {host} but listens on the IPv4 "
            f'address {listen_host}: set host = "::"'
        )
    return host


def one_machine_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a launcher running every node on this machine gives its replicators:
    loopback, unless ``env`` names an address already."""
    return {} if env.get(ADVERTISE_HOST_ENV, "").strip() else {ADVERTISE_HOST_ENV: LOOPBACK}


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
