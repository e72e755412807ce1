"""Every goodput service pod of the Kubernetes deployment serves its Prometheus endpoint on a
named port, announced to Prometheus, at the port the service computes from its environment
(issue 37); asserted on what kubectl renders, for the base and the GKE overlay."""

from __future__ import annotations

from typing import Any

import pytest

from goodput.prometheus_endpoint import (
    METRICS_PORT_ENV,
    PORT_ENV,
    SERVICE_PORT_OFFSETS,
    endpoint_port,
)
from tests.deploy.rendered import BASE, OVERLAY, render

LAYOUTS = {"base": BASE, "gke": OVERLAY}
#: the container of each service's workload
SERVICES = {f"goodput-{name}": name for name in SERVICE_PORT_OFFSETS}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def workloads(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    objects = render(LAYOUTS[request.param])
    return {
        o["metadata"]["name"]: o
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet") and o["metadata"]["name"] in SERVICES
    }


def test_every_service_pod_serves_metrics_on_the_port_it_announces(
    workloads: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert set(workloads) == set(SERVICES)
    for name, workload in workloads.items():
        template = workload["spec"]["template"]
        (service,) = [c for c in template["spec"]["containers"] if c["name"] == SERVICES[name]]
        env = {e["name"]: e.get("value") for e in service.get("env", [])}
        assert env["OTEL_METRICS_EXPORTER"] == "prometheus", name
        assert env["OTEL_EXPORTER_PROMETHEUS_HOST"] == "0.0.0.0", name  # the pod's address
        with monkeypatch.context() as pod_env:  # the pod's environment alone
            for variable in (METRICS_PORT_ENV, PORT_ENV):
                pod_env.delenv(variable, raising=False)
            for variable, value in env.items():
                if value is not None:
                    pod_env.setenv(variable, value)
            served = endpoint_port(SERVICE_PORT_OFFSETS[SERVICES[name]])  # what it binds
        ports = {p["name"]: p["containerPort"] for p in service.get("ports", [])}
        assert ports["metrics"] == served, name
        annotations = template["metadata"].get("annotations", {})
        assert annotations["prometheus.io/scrape"] == "true", name
        assert annotations["prometheus.io/port"] == str(served), name
        assert annotations["prometheus.io/path"] == "/metrics", name
