"""Several embedded nats-servers as one JetStream cluster on loopback (`--nats-cluster N`).

Each member has its own client port, routes port, store and log under the state directory;
every member routes to every other. Streams and buckets on it are R3
(:func:`goodput.bus.settings.stream_replicas`), so any one member can be killed and the bus
keeps serving: clients are given every member's URL and reconnect to a survivor.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from goodput.bus.embedded import (
    EmbeddedNats,
    EmbeddedNatsError,
    EmbeddedRecord,
    ServerRecord,
    free_port,
    read_record,
    running_or_started,
    start_together,
    write_record,
)
from goodput.state_dir import StateDir

#: the smallest cluster worth having: Raft needs three to lose one and keep a quorum
MIN_CLUSTER = 3


def cluster_size(text: str) -> int:
    """``--nats-cluster``: 1 (one server) or a real cluster of at least three."""
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size != 1 and size < MIN_CLUSTER:
        raise argparse.ArgumentTypeError(
            f"{text!r}: 1 (one server) or at least {MIN_CLUSTER} (a cluster that survives "
            "losing one server)"
        )
    return size


def cluster_refusal(size: int, *, explicit_url: bool, running: int = 0) -> str:
    """Why a cluster of ``size`` cannot be honoured, or "": not on a server of the caller's,
    not beside a running embedded bus (of ``running`` servers; 0: none) of another size."""
    if size == 1:
        return ""
    if explicit_url:
        return f"--nats-cluster {size} starts embedded servers; drop it or --nats-url"
    if running and running != size:
        return (
            f"it already runs {running} embedded NATS server(s), not {size}: `goodput down` first"
        )
    return ""


@dataclass
class StackBus:
    """The bus a stack uses: its URL, and what finding it did."""

    url: str
    #: a line saying what was started ("" when a running bus was found, or the caller's)
    started: str = ""
    #: one line per recorded server that was gone or whose pid another process held (never
    #: signalled) when a new bus was started in its place
    stale: list[str] = field(default_factory=list)


def stack_bus(
    paths: StateDir, size: int = 1, port: int | None = None, *, explicit_url: str = ""
) -> StackBus:
    """The bus a stack uses: the caller's (``explicit_url``), else the embedded one recorded
    in ``paths`` while it runs (``nats.json`` read once, its servers checked once:
    :class:`RecordedBus`), else one started now, detached: a cluster of ``size``, or a server
    (on ``port``). A cluster that cannot be honoured is refused (:class:`EmbeddedNatsError`,
    one line)."""
    if explicit_url:
        if refusal := cluster_refusal(size, explicit_url=True):
            raise EmbeddedNatsError(refusal)
        return StackBus(explicit_url)
    # what would be started; the embedded bus's record decides whether it is
    servers = (
        EmbeddedCluster(paths, size, detach=True).members
        if size > 1
        else [EmbeddedNats(paths, port=port, detach=True)]
    )
    found, started = running_or_started(paths, servers)
    if started is None:
        if refusal := cluster_refusal(size, explicit_url=False, running=found.size):
            raise EmbeddedNatsError(f"the stack in {paths.root}: {refusal}")
        return StackBus(found.url)
    stores = ", ".join(server.store_dir for server in started.servers)
    if size > 1:
        what = f"embedded NATS cluster of {size} on {started.url} (stores {stores})"
    else:
        what = f"embedded nats-server on {started.url} (store {stores})"
    return StackBus(started.url, what, found.stale)


class EmbeddedCluster:
    """Start, stop, kill and restart the members of a local JetStream cluster.

    ``detach=True`` starts them in their own sessions (`goodput up`); ``nats.json`` records
    every member, so `goodput down`, the services and the chaos tool find them all.
    """

    def __init__(
        self,
        paths: StateDir,
        size: int = MIN_CLUSTER,
        *,
        detach: bool = False,
        ports: list[int] | None = None,
        cluster_ports: list[int] | None = None,
    ):
        if size < MIN_CLUSTER:
            raise EmbeddedNatsError(
                f"a NATS cluster needs at least {MIN_CLUSTER} servers to survive losing one "
                f"(asked for {size})"
            )
        self.paths = paths
        ports = ports or [free_port() for _ in range(size)]
        routes = cluster_ports or [free_port() for _ in range(size)]
        self.members = [
            EmbeddedNats(self.paths, port, detach=detach, member=i, cluster_ports=routes)
            for i, port in enumerate(ports)
        ]

    @classmethod
    def from_record(cls, paths: StateDir, *, detach: bool = True) -> EmbeddedCluster:
        """The cluster recorded in ``paths`` (to restart a member the chaos tool killed)."""
        record = read_record(paths)
        if record is None or not record.cluster_ports:
            raise EmbeddedNatsError(f"no embedded NATS cluster recorded in {paths.root}")
        return cls(
            paths,
            len(record.servers),
            detach=detach,
            ports=[server.port for server in record.servers],
            cluster_ports=record.cluster_ports,
        )

    @property
    def url(self) -> str:
        return ",".join(member.url for member in self.members)

    def start(self, timeout_s: float = 15.0) -> EmbeddedRecord:
        """Start every member, wait for their client ports, record them.

        JetStream answers "unavailable" until the members have elected a meta leader (a
        second or so): :meth:`goodput.bus.Bus.provision` retries through it.
        """
        self.paths.root.mkdir(parents=True, exist_ok=True)
        return start_together(self.members, timeout_s)

    def kill(self, member: int) -> None:
        """SIGKILL one member (fault injection): its store stays, its peers carry on."""
        self.members[member].kill()

    def restart(self, member: int, timeout_s: float = 15.0) -> ServerRecord:
        """Start a killed or stopped member again on its ports and store; it rejoins and
        catches up from its peers. The record gets its new pid."""
        server = self.members[member]
        server.stop()
        started = server.start(timeout_s)
        record = read_record(self.paths)
        if record is not None:
            record.servers[member] = started
            write_record(self.paths, record)
        return started

    def stop(self, timeout_s: float = 10.0) -> None:
        for member in self.members:
            member.stop(timeout_s)
        self.paths.nats_record.unlink(missing_ok=True)

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
