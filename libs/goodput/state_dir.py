"""Every path under a stack's state directory, named once.

The launcher, the embedded bus, the services, chaos, status and the demo all keep files in one
directory (``--state-dir``); before this module each spelled the names it needed, so the layout
had nine owners. Now it has one: ask a :class:`StateDir` for a path, never join a name to the
root. The layout is the one existing state directories already have, so they keep working.

Names that come from outside (nodes, jobs) are checked as subject tokens first: a forged
``../x`` from the bus or a record cannot lead a path out of the directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from goodput.subjects import check_token


@dataclass(frozen=True)
class StateDir:
    """A stack's state directory; each property or method is one file or folder in it."""

    root: Path

    # the stack: its record, its lock, the services' logs

    @property
    def stack_record(self) -> Path:
        """``stack.json``: the services the launcher started (:mod:`goodput.tools.stack.record`)."""
        return self.root / "stack.json"

    @property
    def lock(self) -> Path:
        """``stack.lock``: held while the stack starts or stops."""
        return self.root / "stack.lock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def service_log(self, service: str, node: str = "") -> Path:
        """A service's output: ``logs/<service>.log``, or ``logs/<service>-<node>.log``."""
        check_token(service, "service")
        return self.logs / (
            f"{service}-{check_token(node, 'node')}.log" if node else f"{service}.log"
        )

    @property
    def standby_logs(self) -> Path:
        """Where warm standby ranks write their output."""
        return self.logs / "standbys"

    def rank_logs(self, attempt: int) -> Path:
        """The output of ``attempt``'s ranks (:mod:`goodput.launch.rank_logs` names the files)."""
        return self.logs / "ranks" / f"attempt-{attempt:03d}"

    # the embedded bus

    @property
    def nats_record(self) -> Path:
        """``nats.json``: the embedded server(s) the stack started."""
        return self.root / "nats.json"

    def nats_store(self, member: int | None = None) -> Path:
        """A server's JetStream store: ``nats-store``, or ``nats-store-<member>`` in a cluster."""
        return self.root / ("nats-store" if member is None else f"nats-store-{member}")

    def nats_log(self, member: int | None = None) -> Path:
        return self.root / ("nats-server.log" if member is None else f"nats-server-{member}.log")

    # checkpoints: the nodes' volumes, the store, the key

    def node(self, node: str) -> Path:
        """``nodes/<node>``: everything a node stores; its peer server serves it."""
        return self.root / "nodes" / check_token(node, "node")

    def nodes(self) -> list[Path]:
        """Every node's directory there is (what `goodput down` sweeps)."""
        return sorted(path for path in (self.root / "nodes").glob("*") if path.is_dir())

    @property
    def object_store(self) -> Path:
        """The replicators' default object store, a directory."""
        return self.root / "object-store"

    @property
    def ckpt_key(self) -> Path:
        """``ckpt.key``: the stack's checkpoint signing key."""
        return self.root / "ckpt.key"

    def agent(self, node: str) -> StateDir:
        """``agents/<node>``: a node agent's own state directory, laid out as a stack's."""
        return StateDir(self.root / "agents" / check_token(node, "node"))

    @property
    def daemons_record(self) -> Path:
        """``daemons.json``: the per-node services a node agent started."""
        return self.root / "daemons.json"

    def daemon_exit_reason(self, service: str) -> Path:
        """Why a node agent's service ended, written by the service beside its log."""
        return self.logs / f"{check_token(service, 'service')}.exit-reason"

    # the job under test: the actuator's rank pids, chaos's records, the demo's outputs

    def ranks_record(self, job: str) -> Path:
        """``ranks-<job>.json``: the local backend's rank pids, read by chaos."""
        return self.root / f"ranks-{check_token(job, 'job')}.json"

    def ranks_records(self) -> list[Path]:
        """Every job's ``ranks-<job>.json`` (what `goodput down` stops)."""
        return sorted(self.root.glob("ranks-*.json"))

    def slow_rank_record(self, job: str, rank: int) -> Path:
        """Chaos's record of a rank it keeps slow, for the command that ends it."""
        return self.root / "chaos" / f"slow-rank-{check_token(job, 'job')}-{rank}.json"

    def slow_rank_log(self, rank: int) -> Path:
        """The output of chaos's detached process that keeps a rank slow."""
        return self.logs / f"chaos-slow-rank-{rank}.log"

    @property
    def shared_checkpoints(self) -> Path:
        """The demo's shared checkpoint directory (the trainer's ``GOODPUT_CKPT_DIR``)."""
        return self.root / "shared-checkpoints"

    @property
    def training_result(self) -> Path:
        """The demo trainer's result file."""
        return self.root / "training-result.json"
