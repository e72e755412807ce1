"""What `goodput bench control-plane` measures over its window: each service's CPU and memory,
the bus's traffic (the server's own ``/varz`` counters, and ``/connz``'s of the connections
watched), the event store's growth, and the publishers' counters, each read at the window's
start and end (:class:`Snapshot`). The services are started here, as the stack starts them.

A service's CPU is its process's and its children's (the controller's policy worker) user +
system seconds over the window's wall seconds: 100 % is one core. Its RSS is the largest
sampled in the window (process and children).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from goodput import subjects
from goodput.bus import Bus
from goodput.checkpoint.format.job_key import stack_key_env
from goodput.owned_process import ProcessIdentity
from goodput.state_dir import StateDir
from goodput.tools.bench.control_plane_fleet import COUNTERS, JOB
from goodput.tools.stack.keeper import kept_service
from goodput.tools.stack.launcher import spawn_service

NS = 1e9
#: the detection thresholds the sensor runs with (the old bench's: one table across versions)
TIMEOUT_S = 2.0
POLL_S = 0.25
SENSOR_THRESHOLDS = (
    f"thresholds={{heartbeat_timeout_s={TIMEOUT_S},heartbeat_polling_period_s={POLL_S},"
    "heartbeat_safety_factor=1.0,first_heartbeat_timeout_s=5.0}"
)


@dataclass
class Service:
    """A service started as `goodput up` starts it: under its keeper, with the stack's flags
    and environment. Measured is the service process the keeper runs."""

    name: str
    keeper: ProcessIdentity
    process: psutil.Process
    log: str
    rss_peak: int = 0

    def cpu_s(self) -> float:
        """User + system seconds of the service and its children so far."""
        total = 0.0
        for proc in [self.process, *self._children()]:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total

    def sample_rss(self) -> None:
        rss = 0
        for proc in [self.process, *self._children()]:
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        self.rss_peak = max(self.rss_peak, rss)

    def _children(self) -> list[psutil.Process]:
        try:
            return self.process.children(recursive=True)
        except psutil.Error:
            return []

    def stop(self) -> None:
        """SIGTERM to the keeper (it passes it on and waits for the service), as `down` does;
        SIGKILL to the keeper's session (it and the service) if that takes over 30 s."""
        try:
            keeper = psutil.Process(self.keeper.pid)
            keeper.send_signal(signal.SIGTERM)
            keeper.wait(30)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            os.killpg(self.keeper.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Wanted:
    """A service to start: its name, its node ("" for a central one), the flags and the
    environment the stack gives it beyond the common ones."""

    name: str
    node: str = ""
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


#: the central services this bench runs, with the flags it gives each beyond the stack's
CENTRAL = [Wanted("sensor", flags=["--set", SENSOR_THRESHOLDS]), Wanted("controller")]


def start_services(
    url: str, state_dir: Path, scale_env: dict[str, str], wanted: list[Wanted]
) -> list[Service]:
    """Each service under its keeper as the stack starts it, with the store scale in its
    environment (the services provision the bus with it)."""
    started = [
        spawn_service(
            service.name,
            service.node,
            job=JOB,
            url=url,
            paths=StateDir(state_dir),
            extra=service.flags,
            secrets={**stack_key_env(state_dir), **scale_env, **service.env},
        )
        for service in wanted
    ]
    services = []
    for record in started:
        deadline = time.monotonic() + 60
        while (child := kept_service(record.process)) is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"{record.key} did not start: see {record.log}")
            time.sleep(0.1)
        services.append(Service(record.name, record.process, psutil.Process(child.pid), record.log))
    return services


def varz(monitor_port: int) -> dict:
    """The server's counters (messages and bytes in and out since it started)."""
    url = f"http://127.0.0.1:{monitor_port}/varz"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def connz(monitor_port: int, names: tuple[str, ...]) -> dict[str, dict]:
    """The open connections named ``names``, as the server counts them (``out_bytes`` and
    ``out_msgs``: what it sent the client); exactly one each, or the bench stops."""
    url = f"http://127.0.0.1:{monitor_port}/connz?limit=100000"
    with urllib.request.urlopen(url, timeout=10) as answer:
        connections = json.load(answer)["connections"]
    found: dict[str, dict] = {}
    for name in names:
        named = [c for c in connections if c.get("name") == name]
        if len(named) != 1:
            raise SystemExit(f"the server lists {len(named)} connections named {name}, not 1")
        found[name] = named[0]
    return found


@dataclass
class Snapshot:
    """Everything the window's figures are differences of."""

    wall: float
    service_cpu_s: dict[str, float]
    server_cpu_s: float
    bus: dict
    events_bytes: int
    events_messages: int
    publishers: list[list[float]] = field(default_factory=list)
    publishers_cpu_s: float = 0.0
    #: the events each durable consumer of GP_EVENTS (the services') has yet to be delivered
    consumers_pending: dict[str, int] = field(default_factory=dict)
    #: the watched connections, by name, as ``/connz`` lists them
    connections: dict[str, dict] = field(default_factory=dict)


async def snapshot(
    bus: Bus,
    services: list[Service],
    server: psutil.Process,
    monitor_port: int,
    counters,
    publishers_cpu_s: float,
    watched: tuple[str, ...] = (),
) -> Snapshot:
    info = await bus.js.stream_info(subjects.EVENTS_STREAM)
    consumers = await bus.js.consumers_info(subjects.EVENTS_STREAM)
    server_times = server.cpu_times()
    return Snapshot(
        wall=time.monotonic(),
        service_cpu_s={s.name: s.cpu_s() for s in services},
        server_cpu_s=server_times.user + server_times.system,
        bus=varz(monitor_port),
        events_bytes=info.state.bytes,
        events_messages=info.state.messages,
        publishers=[list(c) for c in counters],
        publishers_cpu_s=publishers_cpu_s,
        consumers_pending={
            c.config.durable_name: c.num_pending or 0 for c in consumers if c.config.durable_name
        },
        connections=connz(monitor_port, watched),
    )


def figures(before: Snapshot, after: Snapshot, services: list[Service], events_limit: int) -> dict:
    """The window's figures from its two snapshots."""
    window = after.wall - before.wall
    per_s = {
        key: (after.bus[key] - before.bus[key]) / window
        for key in ("in_msgs", "out_msgs", "in_bytes", "out_bytes")
    }
    growth_per_day = (after.events_bytes - before.events_bytes) / window * 86400
    return {
        "window_s": round(window, 1),
        "services": {
            s.name: {
                "cpu_pct": round(
                    100 * (after.service_cpu_s[s.name] - before.service_cpu_s[s.name]) / window, 1
                ),
                "rss_mb": round(s.rss_peak / 1e6, 1),
            }
            for s in services
        },
        # a consumer that keeps up has about a batch pending; one behind, a growing backlog
        "events_pending_at_start": before.consumers_pending,
        "events_pending_at_end": after.consumers_pending,
        "nats_server_cpu_pct": round(100 * (after.server_cpu_s - before.server_cpu_s) / window, 1),
        "bus_in_msgs_per_s": round(per_s["in_msgs"]),
        "bus_out_msgs_per_s": round(per_s["out_msgs"]),
        "bus_in_bytes_per_s": round(per_s["in_bytes"]),
        "bus_out_bytes_per_s": round(per_s["out_bytes"]),
        "events_stored_per_s": round((after.events_messages - before.events_messages) / window, 1),
        "events_growth_bytes_per_day": round(growth_per_day),
        "events_limit_bytes": events_limit,
        "events_limit_holds_h": round(events_limit / growth_per_day * 24, 1)
        if growth_per_day > 0
        else None,
    }


def publisher_figures(
    before: Snapshot, after: Snapshot, heartbeats_due_per_s: float, lags: dict[str, list[float]]
) -> dict:
    """What the simulated ranks published in the window against what was due: heartbeats
    against the ranks' rate (less the silenced ones'), stored events acked against those the
    schedule made due (which a publisher behind its schedule makes late: see the lags). A
    rank's beats in the window are counted to within one: the heartbeat rate is good to
    ``heartbeat_s / window`` (2 % in a 25 s window)."""
    window = after.wall - before.wall

    def delta(name: str) -> float:
        index = COUNTERS.index(name)
        return sum(
            a[index] - b[index] for a, b in zip(after.publishers, before.publishers, strict=True)
        )

    def quantile(role: str, q: float) -> float | None:
        ordered = sorted(lags[role])
        return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 3) if ordered else None

    heartbeats, acked, due = delta("heartbeats"), delta("events_acked"), delta("events_due")
    return {
        "heartbeats_per_s": round(heartbeats / window),
        "heartbeats_due_per_s": round(heartbeats_due_per_s),
        "heartbeats_kept_pct": round(100 * heartbeats / window / heartbeats_due_per_s, 1),
        "events_acked_per_s": round(acked / window, 1),
        "events_due_per_s": round(due / window, 1),
        "events_kept_pct": round(100 * acked / due, 1) if due else None,
        # of the acked: each node's rolled-up steps, its host reports, checkpoint events
        **{
            name: round(delta(name))
            for name in ("steps_acked", "host_reports_acked", "ckpt_events_acked")
        },
        "events_failed": round(sum(c[COUNTERS.index("events_failed")] for c in after.publishers)),
        # how late the ticks of each role's processes left (a tick is 10 ms of the schedule)
        **{
            f"{role}_lag_{name}_s": quantile(role, q)
            for role in lags
            for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
        },
        "cpu_pct": round(100 * (after.publishers_cpu_s - before.publishers_cpu_s) / window, 1),
    }
