"""The node daemons a node agent runs on its host: the host monitor and the replicator.

On Kubernetes they are DaemonSets; on Slurm and bare metal nothing else would run them, and
without a replicator a host's checkpoints stay on its own disk: a replacement host then finds
no copy to restore (``UnfilledVolumeError``) and every relaunch waits out the actuator's
pre-launch restore. So the agent runs both (``goodput agent --no-node-daemons`` where they run
elsewhere), each as the same ``python -m goodput_services.<name>`` process `goodput up`
starts, with this node's name, the agent's state directory (the ranks' volume,
``checkpoint.format.node_volume`` under it, is then the replicator's and the host monitor's),
the agent's bus settings (in the environment, never on a command line), the job's checkpoint
key (``GOODPUT_CKPT_KEY_FILE``, inherited) and, for the replicator, the agent's announced
address as the address peers reach (``GOODPUT_ADVERTISE_HOST``), listening there on the
fixed peer port.

Supervised as `up`'s keeper supervises a service: restarted with
:mod:`goodput.launch.restart_backoff` after any exit the agent did not ask for, except a
refusal of its configuration (it would refuse again: the agent stops, saying why in one line).
Each daemon runs in its own session and gets SIGTERM when the agent dies
(``PR_SET_PDEATHSIG``): a daemon left behind would hold the fixed peer port against the next
agent's. The agent records each one's :class:`~goodput.owned_process.ProcessIdentity` in its
state directory, and a later agent of that directory stops those still running (their
identity checked first, so a recycled pid is never signalled) before starting its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec
import psutil

from goodput.checkpoint.tiers.peer.address import ADVERTISE_HOST_ENV
from goodput.launch.exit_reason import EXIT_REASON_ENV, REFUSED_EXIT_CODE, read_exit_reason
from goodput.launch.restart_backoff import restart_delay, restarts_in_a_row
from goodput.owned_process import ProcessIdentity, stale_line, terminate
from goodput.state_dir import StateDir
from goodput.supervisor.rank_processes import die_with_parent, signal_group

log = logging.getLogger(__name__)

#: the daemons, in the order they start
DAEMONS = ("hostmon", "replicator")
#: exit statuses of a daemon that refused its configuration or its flags
REFUSED_CODES = frozenset({2, REFUSED_EXIT_CODE})
#: a daemon gets SIGTERM when the agent dies (it stops, withdrawing what it announced)
_DIE_WITH_AGENT = die_with_parent(signal.SIGTERM)


class DaemonRefused(RuntimeError):
    """A daemon refused its configuration; the message says which and why (one line)."""


@dataclass(frozen=True)
class DaemonSettings:
    """What the agent hands its daemons."""

    job: str
    node: str
    #: the agent's state directory (``<state>/agents/<node>``)
    state_dir: Path
    #: the agent's announced address: the replicator listens and is reached there
    address: str
    peer_port: int
    #: a goodput.toml whose ``[services.hostmon]``/``[services.replicator]`` tables apply
    config: str = ""
    log_level: str = "info"


def daemon_command(name: str, settings: DaemonSettings) -> list[str]:
    """The command line of daemon ``name`` (no secret on it: every user of the host reads it)."""
    command = [
        sys.executable,
        "-m",
        f"goodput_services.{name}",
        *("--job", settings.job, "--node", settings.node),
        *("--state-dir", str(settings.state_dir), "--log-level", settings.log_level),
        *(["--config", settings.config] if settings.config else []),
    ]
    if name == "replicator":
        command += ["--set", f'host="{settings.address}"', "--set", f"port={settings.peer_port}"]
    return command


def daemon_env(
    name: str, settings: DaemonSettings, base: Mapping[str, str], bus_env: Mapping[str, str]
) -> dict[str, str]:
    """The environment of daemon ``name``: the agent's, its bus settings, where it reports why
    it exited and, for the replicator, the address peers are told."""
    env = {
        **base,
        **bus_env,
        EXIT_REASON_ENV: str(reason_path(settings, name)),
        "PYTHONUNBUFFERED": "1",
    }
    if name == "replicator":
        env[ADVERTISE_HOST_ENV] = settings.address
    return env


def log_path(settings: DaemonSettings, name: str) -> Path:
    return StateDir(settings.state_dir).service_log(name)


def reason_path(settings: DaemonSettings, name: str) -> Path:
    return StateDir(settings.state_dir).daemon_exit_reason(name)


def stop_leftovers(state_dir: Path, timeout_s: float = 10.0) -> list[str]:
    """Stop the daemons an earlier agent of ``state_dir`` recorded and left running; what was
    found, one line each (a pid gone or held by another process is only said, not signalled)."""
    said = []
    for identity in _read_record(StateDir(state_dir).daemons_record):
        found = terminate(identity, timeout_s, group=True)
        if found == "running":
            said.append(f"stopped {identity.describe()} left by an earlier agent")
        else:
            said.append(stale_line("a daemon of an earlier agent", identity, found))
    StateDir(state_dir).daemons_record.unlink(missing_ok=True)
    return said


class NodeDaemons:
    """Runs :data:`DAEMONS` until :meth:`stop`; :meth:`run` raises :class:`DaemonRefused`."""

    def __init__(self, settings: DaemonSettings, bus_env: Mapping[str, str]):
        self.settings = settings
        self.bus_env = dict(bus_env)
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.identities: dict[str, ProcessIdentity] = {}
        self._stopping = False

    async def run(self) -> None:
        """Keep every daemon running; returns only when stopped, raises when one refused."""
        for line in await asyncio.to_thread(stop_leftovers, self.settings.state_dir):
            log.warning("%s", line)
        keepers = [asyncio.create_task(self._keep(name), name=name) for name in DAEMONS]
        try:
            await asyncio.gather(*keepers)
        finally:
            for keeper in keepers:
                keeper.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)

    async def stop(self, timeout_s: float) -> None:
        """SIGTERM each daemon's process group, SIGKILL after ``timeout_s``; wait for them."""
        self._stopping = True
        running = [p for p in self.processes.values() if p.returncode is None]
        for process in running:
            signal_group(process.pid, signal.SIGTERM)
        waits = [asyncio.shield(p.wait()) for p in running]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        for process in running:
            if process.returncode is None:
                signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        StateDir(self.settings.state_dir).daemons_record.unlink(missing_ok=True)

    async def _keep(self, name: str) -> None:
        restarts = 0
        while not self._stopping:
            started = time.monotonic()
            process = await self._start(name)
            code = await process.wait()
            if self._stopping:
                return
            ran_s = time.monotonic() - started
            if code in REFUSED_CODES:
                why = read_exit_reason(
                    reason_path(self.settings, name), log_path(self.settings, name)
                )
                raise DaemonRefused(f"the {name} of {self.settings.node} refused to start: {why}")
            restarts = restarts_in_a_row(restarts, ran_s)
            delay = restart_delay(restarts)
            restarts += 1
            log.warning(
                "the %s exited (status %d) after %.1f s; starting it again in %.0f s",
                name,
                code,
                ran_s,
                delay,
            )
            await asyncio.sleep(delay)

    async def _start(self, name: str) -> asyncio.subprocess.Process:
        settings = self.settings
        logs = log_path(settings, name)
        logs.parent.mkdir(parents=True, exist_ok=True)
        reason_path(settings, name).unlink(missing_ok=True)  # an earlier run's is not this one's
        command = daemon_command(name, settings)
        with open(logs, "ab") as out:
            process = await asyncio.create_subprocess_exec(
                *command,
                env=daemon_env(name, settings, os.environ, self.bus_env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_DIE_WITH_AGENT,
            )
        self.processes[name] = process
        with contextlib.suppress(psutil.Error):  # gone already: its exit is seen at once
            self.identities[name] = ProcessIdentity(
                pid=process.pid,
                started=psutil.Process(process.pid).create_time(),
                cmdline=tuple(command),
            )
        _write_record(StateDir(settings.state_dir).daemons_record, list(self.identities.values()))
        log.info("the %s of %s started: pid %d", name, settings.node, process.pid)
        return process


def _read_record(path: Path) -> list[ProcessIdentity]:
    """The identities recorded at ``path``; none when it is missing or unreadable (a record
    cut short by a crash names nothing that can be checked)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=list[ProcessIdentity])
    except (OSError, msgspec.DecodeError):
        return []


def _write_record(path: Path, identities: list[ProcessIdentity]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_bytes(msgspec.json.encode(identities))
    os.replace(partial, path)
