"""The tables `goodput bench control-plane` prints (its ``--json`` holds every figure)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def show(result: dict) -> None:
    services = Table(title="central services and bus over the window (CPU: % of one core)")
    for column in (
        "ranks",
        "sensor CPU %",
        "sensor MB",
        "controller CPU %",
        "controller MB",
        "nats-server CPU %",
        "bus msgs/s in/out",
        "bus kB/s in/out",
        "events pending at end (durables)",
        "events GB/day",
        "limit holds h",
    ):
        services.add_column(column, justify="right")
    detection = Table(title="missed-heartbeat detection, and what the publishers kept")
    for column in (
        "ranks",
        "p50 s",
        "p99 s",
        "missed",
        "false +",
        "kept up",
        "heartbeats kept %",
        "events kept %",
        "beat lag p99 s",
        "event lag p99 s",
        "publishers CPU %",
    ):
        detection.add_column(column, justify="right")
    for r in result["sweep"]:
        sensor, controller = r["services"]["sensor"], r["services"]["controller"]
        services.add_row(
            f"{r['nodes']} x {r['procs_per_node']}",
            str(sensor["cpu_pct"]),
            str(sensor["rss_mb"]),
            str(controller["cpu_pct"]),
            str(controller["rss_mb"]),
            str(r["nats_server_cpu_pct"]),
            f"{r['bus_in_msgs_per_s']:,} / {r['bus_out_msgs_per_s']:,}",
            f"{r['bus_in_bytes_per_s'] / 1e3:,.0f} / {r['bus_out_bytes_per_s'] / 1e3:,.0f}",
            " / ".join(f"{p:,}" for _, p in sorted(r["events_pending_at_end"].items())),
            f"{r['events_growth_bytes_per_day'] / 1e9:,.2f}",
            str(r["events_limit_holds_h"]),
        )
        publishers = r["publishers"]
        detection.add_row(
            f"{r['nodes']} x {r['procs_per_node']}",
            str(r["p50_detect_s"]),
            str(r["p99_detect_s"]),
            str(r["missed"]),
            str(r["false_positives"]),
            "yes" if r["kept_up"] else "no",
            str(publishers["heartbeats_kept_pct"]),
            str(publishers["events_kept_pct"]),
            str(publishers["heartbeats_lag_p99_s"]),
            str(publishers["events_lag_p99_s"]),
            str(publishers["cpu_pct"]),
        )
    console = Console()
    console.print(services)
    console.print(detection)
    console.print(_replicator(result["sweep"]))


def _replicator(sweep: list[dict]) -> Table:
    """One replicator's cost and what it received (the index's changes, its own replies),
    beside the job's persisted events, which it is not sent (its volume wakes it)."""
    table = Table(title="one real replicator: CPU, memory, what it received per second")
    for column in (
        "ranks",
        "node",
        "CPU %",
        "MB",
        "ready s",
        "read at start MB",
        "received kB/s, msgs/s",
        "job's persisted events (not sent to it) kB/s, msgs/s",
        "index writes/s: copies, addresses",
    ):
        table.add_column(column, justify="right")
    for r in sweep:
        service, received = r["services"]["replicator"], r["replicator"]

        table.add_row(
            f"{r['nodes']} x {r['procs_per_node']}",
            received["node"],
            str(service["cpu_pct"]),
            str(service["rss_mb"]),
            str(received["ready_s"]),
            f"{received['received_before_window_bytes'] / 1e6:,.1f}",
            *(_rates(received, kind) for kind in ("received", "persisted_events")),
            f"{received['index_copy_writes_per_s']}, {received['index_announcements_per_s']}",
        )
    return table


def _rates(figures: dict, kind: str) -> str:
    return f"{figures[f'{kind}_bytes_per_s'] / 1e3:,.2f}, {figures[f'{kind}_msgs_per_s']:,}"
