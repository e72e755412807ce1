"""What the policy worker adds to a decision: ``python -m goodput_services.controller.policy_latency``.

Times ``decide`` of a script that returns at once, through the worker process and through the
engine's in-process thread (which copies the state too), on a job of each size given, and a
worker's start and import. Prints one JSON line per size (milliseconds).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from goodput import schemas
from goodput.supervisor.control.script_policy import ScriptPolicy
from goodput.supervisor.jobstate.folds import new_job_state
from goodput.supervisor.policy import JobState
from goodput_services.controller.policy_process import PolicyProcess

SCRIPT = "def decide(signal, state):\n    return []\n"
PROCS_PER_NODE = 8


def measure(nodes: int, calls: int, script: Path) -> dict[str, float]:
    """Median and 95th percentile of a call each way, and the worker's start, in ms."""
    state = new_job_state(
        "latency",
        [f"node-{i}" for i in range(nodes)],
        spares=[f"spare-{i}" for i in range(max(1, nodes // 64))],
        num_nodes_per_dp=1,
        procs_per_node=PROCS_PER_NODE,
        now=0,
    )
    started = time.perf_counter()
    worker = PolicyProcess(script, timeout_s=60, load_timeout_s=60)
    start_ms = (time.perf_counter() - started) * 1e3
    try:
        through_worker = _timed(worker, state, calls)
    finally:
        worker.close()
    in_process = _timed(ScriptPolicy(script, timeout_s=60), state, calls)
    return {
        "nodes": nodes,
        "state_kib": round(len(msgspec.msgpack.encode(state)) / 1024, 1),
        "worker_p50_ms": through_worker[0],
        "worker_p95_ms": through_worker[1],
        "in_process_p50_ms": in_process[0],
        "in_process_p95_ms": in_process[1],
        "worker_start_ms": round(start_ms, 1),
    }


def _timed(
    policy: PolicyProcess | ScriptPolicy, state: JobState, calls: int
) -> tuple[float, float]:
    signal = schemas.Signal(job=state.job, signal="crash", node=state.active[0])
    policy.decide(signal, state)  # warm
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        policy.decide(signal, state)
        times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    return round(statistics.median(times), 3), round(times[int(0.95 * (len(times) - 1))], 3)


def main(argv: list[str]) -> int:
    sizes = [int(n) for n in argv] or [16, 2048]
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "returns_at_once.py"
        script.write_text(SCRIPT)
        for nodes in sizes:
            print(json.dumps(measure(nodes, 200 if nodes <= 256 else 50, script)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
