"""What the host monitor's GPU probe sees of a process killed mid-kernel (`goodput bench gpu`, D).

``python -m goodput_services.hostmon.kill_probe --describe`` prints the driver's version, or
why NVML cannot be read here; ``--kill PID`` starts the probe (its XID event set registered
first, so only what follows is seen), waits until the driver lists a compute process, sends
PID a SIGKILL, then samples until the dead process has left the GPU's holders and a settling
interval has passed, and prints one JSON object: the XIDs the probe drained, and how long
NVML listed the dead process. The driver knows no PID namespace: where PID itself is never
listed (a container's pid), the holder that leaves after the kill is taken for it.

It runs as a process of its own because the library's bench may not import a service, and
uses :class:`~goodput_services.hostmon.gpu.GpuProbe`, the host monitor's own reads.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

from goodput_services.hostmon.gpu import GpuProbe, load_nvml

#: between two samples of the holders and the XID event set
POLL_S = 0.05
#: how long the dead process may stay listed before the watch gives up on its leaving
GONE_WITHIN_S = 15.0


def describe(probe: GpuProbe) -> dict[str, Any]:
    """The driver's version, or ``unavailable``: why NVML cannot be read (the probe's words)."""
    sample = probe.sample()
    if not sample.available:
        return {"unavailable": sample.detail}
    version = probe.nvml.nvmlSystemGetDriverVersion()
    return {"driver": version.decode() if isinstance(version, bytes) else str(version)}


def _holders(probe: GpuProbe) -> set[int]:
    return {pid for pids in probe.holders(probe.indexes()).values() for pid in pids or []}


def watch_kill(probe: GpuProbe, pid: int, listed_within_s: float, settle_s: float) -> dict:
    """SIGKILL ``pid`` once NVML lists a holder, then time its leaving and collect XIDs: for
    ``settle_s`` at least, and until it left or ``GONE_WITHIN_S`` passed."""
    deadline = time.monotonic() + listed_within_s
    while not (before := _holders(probe)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    by_pid = pid in before
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    gone_after: float | None = None
    xids: dict[int, float] = {}
    while True:
        now = time.monotonic()
        for gpu in probe.sample().gpus:
            for xid in gpu.xid_errors:
                xids.setdefault(xid, now - killed)
        holders = _holders(probe)
        left = pid not in holders if by_pid else bool(before - holders)
        if gone_after is None and before and left:
            gone_after = now - killed
        if now - killed >= settle_s and (gone_after is not None or now - killed >= GONE_WITHIN_S):
            break
        time.sleep(POLL_S)
    return {
        "holders_before_kill": sorted(before),
        "victim_listed_as_its_pid": by_pid,
        "listed_after_kill_s": gone_after,
        "xids": [{"xid": xid, "after_kill_s": at} for xid, at in sorted(xids.items())],
        "watched_s": time.monotonic() - killed,
    }


def main(argv: list[str] | None = None, nvml: Any = None) -> None:
    """``nvml``: pynvml's functions and constants (default: pynvml itself, where installed)."""
    parser = argparse.ArgumentParser(prog="python -m goodput_services.hostmon.kill_probe")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--describe", action="store_true", help="the driver, or why no NVML")
    what.add_argument("--kill", type=int, metavar="PID", help="the process to kill and watch")
    parser.add_argument("--listed-within-s", type=float, default=5.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    probe = GpuProbe(nvml if nvml is not None else load_nvml())
    try:
        report = describe(probe)
        if args.kill is not None and "unavailable" not in report:
            report.update(watch_kill(probe, args.kill, args.listed_within_s, args.settle_s))
    finally:
        probe.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
