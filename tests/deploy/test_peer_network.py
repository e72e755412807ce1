"""Replication across nodes on Kubernetes (issue 37), on what kubectl renders for the base and
the GKE overlay: each replicator listens on its declared port on the pod's interfaces and tells
its peers the pod's IP (never loopback), and a NetworkPolicy admits only replicators there."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from goodput.bus import BusSettings
from goodput.checkpoint.tiers.peer.address import ADVERTISE_HOST_ENV, AddressError
from goodput.checkpoint.tiers.peer.address import advertised_host as address_of
from goodput_services.replicator.options import ReplicatorOptions
from tests.deploy.rendered import (
    BASE,
    OVERLAY,
    config_without_bus,
    container,
    pod_specs,
    render,
    service_config,
)

LAYOUTS = {"base": BASE, "gke": OVERLAY}
REPLICATOR = "goodput-replicator"
#: what the downward API would give a pod (any routable address: it only stands in for one)
POD_IP = "10.8.3.17"


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(LAYOUTS[request.param])


def _options(objects: list[dict[str, Any]], tmp_path: Path) -> ReplicatorOptions:
    settings = service_config(objects, REPLICATOR, config_without_bus(tmp_path))
    return ReplicatorOptions.from_mapping(settings.options)


def _peer_port(objects: list[dict[str, Any]]) -> int:
    (port,) = [p for p in container(objects, REPLICATOR)["ports"] if p["name"] == "peer-data"]
    assert port.get("protocol", "TCP") == "TCP"
    return port["containerPort"]


def _metrics_port(objects: list[dict[str, Any]]) -> int:
    (port,) = [p for p in container(objects, REPLICATOR)["ports"] if p["name"] == "metrics"]
    return port["containerPort"]


def _bus_hosts() -> list[str]:
    bus = tomllib.loads((BASE / "goodput.toml").read_text())["bus"]
    return BusSettings(url=bus["url"]).hosts()


def _template_labels(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Every workload's pod template labels, by workload name."""
    return {
        o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
    }


def test_the_replicator_advertises_the_pod_ip_on_its_declared_port(objects, tmp_path) -> None:
    options = _options(objects, tmp_path)
    assert options.port == _peer_port(objects), "the peer port is not the declared one"
    assert options.advertise_host == "", "a fixed advertise_host would override the pod's IP"
    spec = pod_specs(objects)[REPLICATOR]
    assert not spec.get("hostNetwork"), "the pod's IP is the node's only without hostNetwork"
    env = {e["name"]: e for e in container(objects, REPLICATOR)["env"]}
    source = env[ADVERTISE_HOST_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
    assert source == "status.podIP"
    # what the replicator tells its peers, with the bus of goodput.toml (on other hosts)
    address = address_of(
        options.host, options.advertise_host, {ADVERTISE_HOST_ENV: POD_IP}, _bus_hosts()
    )
    assert address == POD_IP
    # it listens where that address arrives: every interface of the pod
    assert options.host in ("0.0.0.0", "::")
    # without the downward API's address it would advertise nothing usable, and refuses
    with pytest.raises(AddressError, match="would advertise"):
        address_of(options.host, options.advertise_host, {}, _bus_hosts())


def test_without_these_settings_the_replicator_refuses_to_announce_loopback(objects) -> None:
    """The manifests before issue 37: the default listener (loopback, a random port) and no
    address from the downward API, with the cluster's bus: refused, not announced."""
    default = ReplicatorOptions.from_mapping({})
    with pytest.raises(AddressError, match=r"loopback address 127\.0\.0\.1 while the bus"):
        address_of(default.host, default.advertise_host, {}, _bus_hosts())


def test_a_network_policy_admits_only_replicators_on_the_peer_port(objects) -> None:
    labels = _template_labels(objects)[REPLICATOR]
    policies = [
        o
        for o in objects
        if o["kind"] == "NetworkPolicy"
        and o["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
        and o["spec"]["podSelector"].get("matchLabels")
    ]
    (policy,) = policies
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    # the peer port from replicators only; the metrics port, read-only, from any scraper
    rule, metrics = spec["ingress"]
    assert metrics == {"ports": [{"protocol": "TCP", "port": _metrics_port(objects)}]}
    (source,) = rule["from"]
    assert set(source) == {"podSelector"}, "no namespace or IP block: replicators only"
    assert source["podSelector"]["matchLabels"].items() <= labels.items()
    assert rule["ports"] == [{"protocol": "TCP", "port": _peer_port(objects)}]
    # the policy selects no other workload: their ingress stays as it was
    others = {n: ls for n, ls in _template_labels(objects).items() if n != REPLICATOR}
    for name, other in others.items():
        assert not spec["podSelector"]["matchLabels"].items() <= other.items(), name
