"""The knob names users bring from Google's resiliency supervisor (its ``values-supervisor.yaml``),
accepted in a config file's ``[supervisor]`` table where goodput has a setting of the same meaning.

This module owns that vocabulary: :data:`ALIASES` maps each accepted name to the service and
option it sets; :data:`REJECTED` gives, for each name goodput has no equivalent of (or means
differently), the one line saying what to use instead. ``deploy/k8s/README.md`` documents
exactly these names (a test compares them).

A table rather than top-level keys: the top level is goodput's own (``job``, ``log_level``,
``[bus]``), which an imported name must never shadow, and the table says where the names
come from. The aliases are moved onto the ``[services.<service>]`` tables when the file is
loaded, so each service then merges and checks them as it does its own options.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import msgspec

#: the config file's table holding the supervisor's names
TABLE = "supervisor"


@dataclass(frozen=True)
class Alias:
    #: the service whose options it sets (a field of ``config.ServiceTables``)
    service: str
    #: the option inside that service's options table (nested tables first)
    path: tuple[str, ...]
    #: the option's type, checked here so that every service refuses a mistyped value, not
    #: only the one owning it (its value checks stay with its options struct)
    kind: type

    def where(self, table: str) -> str:
        """``[<table>.<nested>] <option>``, as a user finds it in the file."""
        return f"[{'.'.join((table, *self.path[:-1]))}] {self.path[-1]}"


ALIASES: dict[str, Alias] = {
    "heartbeat_polling_period_s": Alias(
        "sensor", ("thresholds", "heartbeat_polling_period_s"), float
    ),
    "heartbeat_timeout_s": Alias("sensor", ("thresholds", "heartbeat_timeout_s"), float),
    "pod_termination_threshold_s": Alias(
        "sensor", ("thresholds", "pod_termination_threshold_s"), float
    ),
    "jobset_downtime_threshold_s": Alias(
        "sensor", ("thresholds", "jobset_downtime_threshold_s"), float
    ),
    "num_nodes_per_dp": Alias("controller", ("num_nodes_per_dp",), int),
    "enable_fault_injection": Alias("hostmon", ("enable_fault_injection",), bool),
}


def _component(section: str, service: str, kind: str, manifest: str) -> str:
    """Why a component section (``image``, ``port``, ``command``) is no goodput option."""
    return (
        f"the {section} is goodput's {service}, the goodput-{service} {kind} of "
        f"deploy/k8s/base/{manifest}: its image is the overlay's images: entry, its command is "
        "fixed there, the services reach each other over the bus (no port to set), and its "
        f"options go under [services.{service}]"
    )


REJECTED: dict[str, str] = {
    "num_dp_replicas": "the job's size is given per job, not to the services: goodput run "
    "--nodes <num_dp_replicas x num_nodes_per_dp> --nodes-per-dp <num_nodes_per_dp>",
    "workers_per_host": "ranks per node are given per job: goodput run --procs-per-node",
    "fault_injection_period_s": "no service injects faults on its own: run goodput chaos run "
    "SCENARIO.toml with a fault whose rate_per_day is 86400 / fault_injection_period_s (a "
    "Poisson process of that mean period), on hosts with enable_fault_injection = true",
    "host_daemon": _component("host daemon", "hostmon", "DaemonSet", "node-daemons.yaml"),
    "sensor": _component("sensor", "sensor", "Deployment", "supervisor.yaml"),
    "controller": _component("controller", "controller", "Deployment", "supervisor.yaml"),
    "actuator": _component("actuator", "actuator", "Deployment", "supervisor.yaml"),
}


def apply_aliases(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of the parsed config file ``data`` whose ``[supervisor]`` table is moved onto the
    services' option tables.

    Raises ValueError with one line naming every problem: an unknown or rejected name, a
    mistyped value, or an option also set under goodput's own name (``[options]`` or
    ``[services.<service>]``): two values for one option would leave the user guessing
    which one holds.
    """
    if TABLE not in data:
        return data
    result = copy.deepcopy(data)
    knobs = result.pop(TABLE)
    if not isinstance(knobs, dict):
        raise ValueError(f"[{TABLE}] must be a table, not {type(knobs).__name__}")
    problems = [problem for name, value in knobs.items() if (problem := _move(result, name, value))]
    if problems:
        raise ValueError("; ".join(problems))
    return result


def _move(data: dict[str, Any], name: str, value: Any) -> str:
    """Sets the option ``name`` stands for in ``data``; else the problem, in one line."""
    if name in REJECTED:
        return f"[{TABLE}] {name} has no goodput equivalent: {REJECTED[name]}"
    alias = ALIASES.get(name)
    if alias is None:
        return (
            f"unknown [{TABLE}] key {name!r}: it accepts {', '.join(ALIASES)}; goodput's own "
            "options go under [services.<service>] (deploy/k8s/README.md)"
        )
    try:
        value = msgspec.convert(value, alias.kind)
    except msgspec.ValidationError as exc:
        return f"[{TABLE}] {name}: {exc}"
    try:
        for table in (("options",), ("services", alias.service)):
            if _lookup(data, (*table, *alias.path)) is not _MISSING:
                return (
                    f"[{TABLE}] {name} and {alias.where('.'.join(table))} set the same "
                    "option: keep one"
                )
        _place(data, ("services", alias.service, *alias.path), value)
    except ValueError as exc:
        return str(exc)
    return ""


_MISSING = object()


def _lookup(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = data
    for depth, key in enumerate(path):
        if not isinstance(node, dict):
            raise ValueError(f"[{'.'.join(path[:depth])}] must be a table")
        if key not in node:
            return _MISSING
        node = node[key]
    return node


def _place(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for depth, key in enumerate(path[:-1]):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"[{'.'.join(path[: depth + 1])}] must be a table")
    node[path[-1]] = value
