"""`goodput bench gpu` phase D: a process killed mid-kernel, as the host monitor sees it.

A victim process queues matrix products on the GPU without end (a kernel is always running)
and says so; the host monitor's probe (``python -m goodput_services.hostmon.kill_probe``, a
process: the library imports no service) registers for XIDs, SIGKILLs the victim once the
driver lists it, and reports the XIDs that came and how long NVML listed the dead process
(what a GPU reset waits for). This process holds no CUDA context, so the victim is the
GPU's only holder from here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from goodput.tools.bench.gpu_phases import say

#: the probe's module, run as a process (as `goodput up` runs the services)
PROBE = "goodput_services.hostmon.kill_probe"
#: a kernel always running: products queued faster than the GPU runs them
VICTIM = """
import torch
a = torch.randn(8192, 8192, device="cuda")
b = torch.empty_like(a)
torch.cuda.synchronize()
for _ in range(8):
    torch.mm(a, a, out=b)
print("running", flush=True)
while True:
    torch.mm(a, a, out=b)
"""
#: how long the victim may take to end once killed, and the probe to run (its watch ends
#: within 15 s of the kill: within the phase's budget)
START_S = 15.0
WATCH_S = 30.0


def nvml_missing() -> str:
    """Why the host monitor's probe cannot read NVML here ("" where it can)."""
    return str(_probe(["--describe"], WATCH_S).get("unavailable", ""))


def driver_version() -> str | None:
    return _probe(["--describe"], WATCH_S).get("driver")


def _probe(args: list[str], timeout_s: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", PROBE, *args], capture_output=True, text=True, timeout=timeout_s
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = done.stderr.strip().splitlines()
        return {"unavailable": f"{PROBE} exited {done.returncode}: {tail[-1] if tail else ''}"}
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def phase_d(args: argparse.Namespace) -> dict[str, Any]:
    victim = subprocess.Popen([sys.executable, "-c", VICTIM], stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None
        line = victim.stdout.readline()  # blocks until the kernels run (or the victim died)
        if line.strip() != "running":
            raise RuntimeError(f"the victim did not start its kernels (exit {victim.wait(5)})")
        say(f"D: victim {victim.pid} runs kernels; the probe kills it")
        seen = _probe(["--kill", str(victim.pid)], WATCH_S)
        if "unavailable" in seen:
            raise RuntimeError(seen["unavailable"])
        seen["victim_exit"] = victim.wait(START_S)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    seen["notes"] = (
        "xids: what the host monitor's XID event set delivered from the kill until the watch"
        " ended (none is a finding too); listed_after_kill_s: from SIGKILL until NVML's"
        " compute processes no longer list the victim (null: still listed when the watch"
        " gave up, or never listed)"
    )
    return seen
