"""Which network interface the collectives' sockets use: the environment contract between a
node agent and torch's process-group backends.

Gloo and NCCL pick their interface themselves: gloo the address the host name resolves to,
which is a loopback one on a stock Debian host (``127.0.1.1 <hostname>`` in ``/etc/hosts``),
so every rank on another host was told to connect to ``127.0.0.1`` (``connectFullMesh
failed``). The agent therefore names the interface that holds the address it announced (the
rendezvous's ``MASTER_ADDR`` is that address too) in :data:`VARIABLES`, each only where the
user did not set it: a value in the rank's own environment (``StartJob.env``) or the agent's
wins (:func:`socket_env`).

The interfaces and their addresses are read with the standard library only (any Linux host,
no iproute2 needed): each interface's IPv4 address with the ``SIOCGIFADDR`` ioctl, its IPv6
addresses from ``/proc/net/if_inet6``. An IPv4 address held as a secondary address of an
interface is not seen that way; none is set then, and the agent says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping
from pathlib import Path

#: the variables naming the interface, gloo's and NCCL's (torch's ``ProcessGroupGloo`` and
#: NCCL's bootstrap read them when a group is created)
VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

_SIOCGIFADDR = 0x8915
_IF_INET6 = Path("/proc/net/if_inet6")

#: interface name -> the addresses it holds (normalised text)
Interfaces = Mapping[str, list[str]]


def interface_holding(address: str, interfaces: Interfaces) -> str | None:
    """The interface that holds ``address`` (None: no interface does, or it is no address)."""
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for name, held in sorted(interfaces.items()):
        for text in held:
            with contextlib.suppress(ValueError):
                if ipaddress.ip_address(text) == wanted:
                    return name
    return None


def socket_env(interface: str | None, user_env: Mapping[str, str]) -> dict[str, str]:
    """The variables of :data:`VARIABLES` to give the ranks: ``interface`` for each that
    ``user_env`` leaves unset or empty (nothing when no interface was found)."""
    if not interface:
        return {}
    return {name: interface for name in VARIABLES if not user_env.get(name, "").strip()}


def host_interfaces(if_inet6: Path = _IF_INET6) -> dict[str, list[str]]:
    """This host's interfaces and the addresses they hold (module docstring: how)."""
    found: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                request = struct.pack("256s", name.encode()[:15])
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
                found.setdefault(name, []).append(socket.inet_ntoa(reply[20:24]))
    with contextlib.suppress(OSError):
        for line in if_inet6.read_text().splitlines():
            fields = line.split()
            if len(fields) == 6:
                packed = bytes.fromhex(fields[0])
                found.setdefault(fields[5], []).append(str(ipaddress.IPv6Address(packed)))
    return found
