"""A real Slurm cluster for one test: slurmctld and one slurmd per network namespace.

The controller's namespace holds a bridge, each node's namespace one veth end on it with an
address of :data:`SUBNET_PREFIX` (a private /24 that exists only inside these namespaces: no
traffic leaves them); cutting a node's link is taking its end on the bridge down. Every daemon
runs in its own mount namespace (``nsenter --net=… unshare -m``: ``ip netns exec`` would
remount /sys), where ``/etc/hosts`` names the nodes and the node-local directory is the node's
own: nothing but the repository, the Python environment and the supervisor's state is shared,
as on a cluster without a shared checkpoint filesystem. One munged serves all of them.
Needs root, iproute2, util-linux and Debian's slurm-wlm + munge; :func:`cluster` skips, saying
why, without them. Everything started is stopped, and the namespaces deleted, when the block
ends, failed or not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.processes import kill
from tests.replicator.netns import add_netns, ip, must_ip

#: the cluster's subnet: inside the test's own namespaces only (10.250.37.0/24 is the
#: replicator test's)
SUBNET_PREFIX = "10.250.38."
CONTROLLER_ADDRESS = SUBNET_PREFIX + "1"
#: the interface name inside every node's namespace (the same on each, as on a cluster's
#: identical hosts: GLOO_SOCKET_IFNAME names it)
NODE_INTERFACE = "gpeth0"
#: Slurm's view of a node that stopped answering: short, so a test sees it within minutes
SLURMD_TIMEOUT_S = 20
BINARIES = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "munged", "nsenter", "unshare")


@dataclass
class Node:
    name: str
    netns: str
    address: str
    #: this node's end of its link on the controller's bridge
    bridge_end: str
    #: what the node sees at the cluster's node-local path
    local_dir: Path
    slurmd: subprocess.Popen | None = None


@dataclass
class Cluster:
    root: Path
    conf: Path
    controller_netns: str
    nodes: list[Node]
    #: the path every node sees as its own disk
    node_local: Path
    env: dict[str, str]
    processes: list[subprocess.Popen] = field(default_factory=list)

    def client(
        self, *argv: str, env: dict[str, str] | None = None, timeout_s: float = 30
    ) -> subprocess.CompletedProcess:
        """A Slurm client command (sbatch, scontrol…) in the controller's namespace, with
        ``env`` over the cluster's environment (a job submitted takes it along)."""
        return subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.controller_netns}", *argv],
            capture_output=True,
            text=True,
            env={**self.env, **(env or {})},
            timeout=timeout_s,
        )

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def cut_link(self, name: str) -> None:
        must_ip("-n", self.controller_netns, "link", "set", self.node(name).bridge_end, "down")

    def mend_link(self, name: str) -> None:
        must_ip("-n", self.controller_netns, "link", "set", self.node(name).bridge_end, "up")

    def kill_slurmd(self, name: str) -> None:
        process = self.node(name).slurmd
        assert process is not None
        kill(process)

    def start_slurmd(self, node: Node) -> None:
        node.slurmd = self._daemon(
            node.netns,
            [
                f"hostname {node.name}",
                f"mount --bind {node.local_dir} {self.node_local}",
                f"exec slurmd -D -N {node.name} -f {self.conf}",
            ],
            self.root / f"slurmd-{node.name}.out",
        )

    def _daemon(self, netns: str, script: list[str], log: Path) -> subprocess.Popen:
        """``script`` (shell lines) in ``netns`` and mount and host-name namespaces of its own,
        where /etc/hosts names the cluster's nodes."""
        lines = [f"mount --bind {self.root / 'hosts'} /etc/hosts", *script]
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [*_in_namespaces(netns), "sh", "-ec", "; ".join(lines)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def node_states(self) -> dict[str, str]:
        done = self.client("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (empty once Slurm forgot the job)."""
        done = self.client("scontrol", "show", "job", "-o", job_id)
        fields: dict[str, str] = {}
        for word in done.stdout.split():
            key, sep, value = word.partition("=")
            if sep:
                fields[key] = value
        return fields

    def logs(self) -> str:
        """The daemons' log tails, for a failed assertion."""
        parts = []
        for log in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)


def _in_namespaces(netns: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{netns}", "unshare", "-m", "-u"]


def until(done: Callable[[], bool], what: str, timeout_s: float, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs()}")
        time.sleep(1)


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("a real Slurm in network namespaces needs root")
    missing = [b for b in ("ip", *BINARIES) if shutil.which(b) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install -y slurm-wlm munge iproute2)")


def _slurm_conf(root: Path, nodes: list[Node]) -> str:
    node_lines = "\n".join(
        f"NodeName={n.name} NodeAddr={n.address} CPUs=1 RealMemory=1000 State=UNKNOWN"
        for n in nodes
    )
    return f"""ClusterName=goodput-test
SlurmctldHost=ctl({CONTROLLER_ADDRESS})
SlurmUser=root
MailProg=/bin/true
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root / "munge.socket"}
StateSaveLocation={root / "ctld-state"}
SlurmdSpoolDir={root / "spool"}/%n
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd-%n.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd-%n.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
SlurmdTimeout={SLURMD_TIMEOUT_S}
ReturnToService=2
KillWait=30
{node_lines}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def cluster(root: Path, node_count: int, env: dict[str, str]) -> Iterator[Cluster]:
    """A running cluster of ``node_count`` idle nodes; torn down afterwards, failed or not."""
    _skip_unless_possible()
    tag = uuid.uuid4().hex[:6]
    controller = f"gps-{tag}-ctl"
    nodes = [
        Node(
            name=f"gpn{i}",
            netns=f"gps-{tag}-n{i}",
            address=f"{SUBNET_PREFIX}{10 + i}",
            bridge_end=f"gps{tag}b{i}",
            local_dir=root / "nodes" / f"gpn{i}",
        )
        for i in range(node_count)
    ]
    node_local = root / "node-local"
    env = {**env, "SLURM_CONF": str(root / "slurm.conf")}
    made = Cluster(root, root / "slurm.conf", controller, nodes, node_local, env)
    created: list[str] = []
    try:
        for netns in [controller, *(n.netns for n in nodes)]:
            add_netns(netns)
            created.append(netns)
        _wire(made)
        _configure(made)
        yield made
    finally:
        _stop(made.processes, created)
        for netns in reversed(created):  # veth ends and the bridge go with their namespaces
            ip("netns", "del", netns)


def _wire(made: Cluster) -> None:
    ctl = made.controller_netns
    must_ip("-n", ctl, "link", "set", "lo", "up")
    must_ip("-n", ctl, "link", "add", "gpbr0", "type", "bridge")
    must_ip("-n", ctl, "addr", "add", f"{CONTROLLER_ADDRESS}/24", "dev", "gpbr0")
    must_ip("-n", ctl, "link", "set", "gpbr0", "up")
    for node in made.nodes:
        must_ip(
            *("link", "add", node.bridge_end, "netns", ctl, "type", "veth"),
            *("peer", "name", NODE_INTERFACE, "netns", node.netns),
        )
        must_ip("-n", ctl, "link", "set", node.bridge_end, "master", "gpbr0")
        must_ip("-n", ctl, "link", "set", node.bridge_end, "up")
        must_ip("-n", node.netns, "link", "set", "lo", "up")
        must_ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", NODE_INTERFACE)
        must_ip("-n", node.netns, "link", "set", NODE_INTERFACE, "up")


def _configure(made: Cluster) -> None:
    root = made.root
    for directory in ("ctld-state", "spool", "node-local"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for node in made.nodes:
        node.local_dir.mkdir(parents=True, exist_ok=True)
        (root / "spool" / node.name).mkdir(parents=True, exist_ok=True)
    hosts = ["127.0.0.1 localhost", f"{CONTROLLER_ADDRESS} ctl"]
    hosts += [f"{n.address} {n.name}" for n in made.nodes]
    (root / "hosts").write_text("\n".join(hosts) + "\n")
    made.conf.write_text(_slurm_conf(root, made.nodes))
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munged = subprocess.run(
        [
            "munged",
            "--force",
            f"--key-file={key}",
            f"--socket={root / 'munge.socket'}",
            f"--pid-file={root / 'munged.pid'}",
            f"--log-file={root / 'munged.log'}",
            f"--seed-file={root / 'munged.seed'}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if munged.returncode != 0:
        raise RuntimeError(f"munged: {munged.stderr.strip()}")
    made.processes.append(_PidFile(root / "munged.pid"))  # type: ignore[arg-type]
    made._daemon(
        made.controller_netns,
        ["hostname ctl", f"exec slurmctld -D -c -f {made.conf}"],
        root / "ctld.out",
    )
    for node in made.nodes:
        made.start_slurmd(node)
    until(
        lambda: (
            set(made.node_states().values()) == {"idle"}
            and len(made.node_states()) == len(made.nodes)
        ),
        "every node idle",
        90,
        made.logs,
    )


class _PidFile:
    """munged daemonizes: stopped by the pid it writes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def poll(self) -> int | None:
        return None

    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(self.path.read_text().strip())
        return None

    def terminate(self) -> None:
        pid = self.pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def wait(self, timeout: float) -> None:
        pid = self.pid()
        deadline = time.monotonic() + timeout
        while pid and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stop(processes: list, netns: list[str]) -> None:
    """Every process in the cluster's namespaces (daemons, step daemons, whatever a job left),
    then munged: SIGTERM, SIGKILL what is still there after 15 s."""
    inodes = set()
    for name in netns:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/run/netns/{name}").st_ino)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in in_namespaces(inodes):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 15
        while in_namespaces(inodes) and time.monotonic() < deadline:
            time.sleep(0.2)
    for process in reversed(processes):
        if isinstance(process, _PidFile):
            process.terminate()
            process.wait(15)
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)


def in_namespaces(inodes: set[int]) -> list[int]:
    """The pids whose network namespace is one of ``inodes``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "net").st_ino in inodes:
                    found.append(int(entry.name))
    return found


def marked(name: str, value: str) -> list[str]:
    """``pid: command`` of every process whose environment holds ``name=value``."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                    found.append(f"{entry.name}: {command.decode(errors='replace')[:200]}")
    return found
