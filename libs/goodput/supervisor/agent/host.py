"""What an agent tells about its host: the address other hosts reach it at, its GPUs, a free
port there. Small probes, each replaceable by an explicit flag."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path


def is_loopback(address: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(address).is_loopback
    return address == "localhost"


def host_address(toward: str = "") -> str:
    """This host's address on the interface that reaches ``toward`` (the bus's host, else a
    public address; no packet is sent: a UDP socket only picks its route), else the address
    the host name resolves to. A loopback bus says nothing about the other hosts: the route
    of the default interface is taken then."""
    targets = [t for t in (toward,) if t and not is_loopback(t)] + ["192.0.2.1"]
    for target in targets:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            address = s.getsockname()[0]
            if not is_loopback(address) and address != "0.0.0.0":
                return address
    with contextlib.suppress(OSError):
        return socket.gethostbyname(socket.gethostname())
    return "127.0.0.1"


def visible_gpus(env: Mapping[str, str], dev: Path = Path("/dev")) -> list[int]:
    """GPU indexes this host gives its ranks: ``CUDA_VISIBLE_DEVICES`` when set (Slurm sets it
    for a step with GPUs; ordinals only — UUIDs count by position), else the NVIDIA device
    files present."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in items):
            return [int(v) for v in items]
        return list(range(len(items)))
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(dev):
            match = re.fullmatch(r"nvidia(\d+)", entry)
            if match:
                found.append(int(match.group(1)))
    return sorted(found)


def free_port(address: str = "") -> int:
    """A TCP port free now on this host (the rendezvous binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]
