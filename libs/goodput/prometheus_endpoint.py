"""The Prometheus endpoint of a process (``OTEL_METRICS_EXPORTER=prometheus``) and its port.

OpenTelemetry's variables name one address: ``OTEL_EXPORTER_PROMETHEUS_HOST`` (default
``localhost``) and ``OTEL_EXPORTER_PROMETHEUS_PORT`` (default 9464). Every service and rank of
a host inherits them from `goodput up` or the actuator, so each process serves on the base
port plus an offset of its own: a rank its local rank (9464-9471 for eight), each service a
fixed one from :data:`SERVICE_PORT_OFFSETS` (9528-9532). ``GOODPUT_METRICS_PORT`` names the
exact port of one process instead (two controllers on one host, a pod's fixed port).

A port that cannot be bound costs the process its endpoint, never its work: one log line,
and the metrics stay the API's no-ops. Prometheus pulls, so a short-lived command
(`goodput report`) has nothing to serve; it pushes with ``otlp`` or ``console`` instead.
"""

from __future__ import annotations

import logging
import os

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import start_http_server

log = logging.getLogger(__name__)

HOST_ENV = "OTEL_EXPORTER_PROMETHEUS_HOST"
PORT_ENV = "OTEL_EXPORTER_PROMETHEUS_PORT"
#: goodput's own: the exact port of this one process, over the base-plus-offset scheme
METRICS_PORT_ENV = "GOODPUT_METRICS_PORT"
DEFAULT_HOST = "localhost"
#: the OpenTelemetry default, registered for the OTel Prometheus exporter
DEFAULT_PORT = 9464
#: ranks take base + local rank; services start past room for this many local ranks
SERVICE_PORT_BASE_OFFSET = 64
#: each service's offset from the base port (one of each may run on a host)
SERVICE_PORT_OFFSETS: dict[str, int] = {
    name: SERVICE_PORT_BASE_OFFSET + index
    for index, name in enumerate(("sensor", "controller", "actuator", "hostmon", "replicator"))
}


class EndpointSettingsError(ValueError):
    """A malformed port variable; the message names it."""


def _port_variable(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise EndpointSettingsError(f"{name}={raw!r} is not a TCP port")
    return port


def endpoint_port(offset: int) -> int:
    """This process's port: ``GOODPUT_METRICS_PORT``, else the base port plus ``offset``."""
    exact = _port_variable(METRICS_PORT_ENV)
    if exact is not None:
        return exact
    port = (_port_variable(PORT_ENV) or DEFAULT_PORT) + offset
    if port >= 65536:
        raise EndpointSettingsError(f"{PORT_ENV} plus this process's offset {offset} is past 65535")
    return port


def endpoint_host() -> str:
    return os.environ.get(HOST_ENV, "").strip() or DEFAULT_HOST


def serve_prometheus(offset: int) -> PrometheusMetricReader | None:
    """Serve this process's metrics on ``/metrics``; None (one log line) when it cannot."""
    host = endpoint_host()
    try:
        port = endpoint_port(offset)
    except EndpointSettingsError as exc:
        log.warning("no Prometheus endpoint, metrics not served: %s", exc)
        return None
    try:
        start_http_server(port, addr=host)
    except OSError as exc:  # in use, or a host this machine does not have
        log.warning("no Prometheus endpoint on %s:%d, metrics not served: %s", host, port, exc)
        return None
    log.info("Prometheus metrics served on http://%s:%d/metrics", host, port)
    return PrometheusMetricReader()
