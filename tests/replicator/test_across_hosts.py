"""Replication between two hosts (issue 37): two replicators in two network namespaces, as two
pods each with its own IP, both on the Kubernetes manifests' settings (every interface, the
fixed port 7450, the address told to peers from GOODPUT_ADVERTISE_HOST) with their own
volumes and the job's key, on one bus in the first namespace, reached over the pair's
addresses with a password (goodput refuses a remote bus without one)."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import pytest

from goodput.bus.embedded import nats_server_binary
from goodput.bus.settings import ENV_VARS
from goodput.checkpoint.format import node_volume, peer_root, step_dir_name
from goodput.checkpoint.format.job_key import KEY_FILE_ENV, create_key_file
from goodput.checkpoint.tiers.peer.address import ADVERTISE_HOST_ENV
from tests.replicator.conftest import FAST, JOB, file_checksums, write_checkpoint
from tests.replicator.netns import Host, two_hosts

#: the manifests' peer port (node-daemons.yaml): the same on every host, as on every pod
PEER_PORT = 7450
NATS_PORT = 4222
STEP = 10
#: every wait's bound: the replicators poll every 0.2 s, a copy of 2 MiB takes well under 1 s
WAIT_S = 90.0


def _start_bus(host: Host, work: Path, password: str) -> None:
    """nats-server with JetStream in ``host``, on its pair address only, with a password."""
    conf = work / "nats.conf"
    conf.write_text(
        f'listen: "{host.address}:{NATS_PORT}"\n'
        f'jetstream {{ store_dir: "{work / "nats-store"}" }}\n'
        f'authorization {{ user: "goodput", password: "{password}" }}\n'
    )
    log = work / "nats.log"
    server = host.start([nats_server_binary(), "--config", str(conf)], log, dict(os.environ))
    _until(lambda: "Server is ready" in log.read_text(errors="replace"), "nats-server", [log])
    assert server.poll() is None, log.read_text(errors="replace")[-2000:]


def _until(done, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            tails = {str(p): p.read_text(errors="replace")[-1500:] for p in logs if p.exists()}
            raise AssertionError(f"timed out waiting for {what}; logs: {json.dumps(tails)}")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_checkpoint_replicates_between_two_hosts_over_their_advertised_addresses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_key_file(tmp_path / "ckpt.key")
    monkeypatch.setenv(KEY_FILE_ENV, str(key))  # the engine below signs with it
    password = secrets.token_hex(16)
    with two_hosts() as (host_a, host_b):
        url = f"nats://{host_a.address}:{NATS_PORT}"
        _start_bus(host_a, tmp_path, password)
        env = {
            **os.environ,
            KEY_FILE_ENV: str(key),
            ENV_VARS["user"]: "goodput",
            ENV_VARS["password"]: password,
            "PYTHONUNBUFFERED": "1",
        }
        nodes = {"node-a": host_a, "node-b": host_b}
        logs = [tmp_path / f"replicator-{node}.log" for node in nodes]
        options = {
            **FAST,
            "replicas": "1",
            "dedup_wait_s": "0.5",
            "host": '"0.0.0.0"',
            "port": str(PEER_PORT),
            # one store for the job, as a bucket is: a dir: outside both state directories
            "object_store": f'"dir:{tmp_path / "object-store"}"',
        }
        for node, host in nodes.items():
            sets = [item for k, v in options.items() for item in ("--set", f"{k}={v}")]
            host.start(
                [
                    *(sys.executable, "-m", "goodput_services.replicator"),
                    *("--job", JOB, "--node", node, "--nats-url", url),
                    *("--state-dir", str(tmp_path / node), *sets),
                ],
                tmp_path / f"replicator-{node}.log",
                {**env, ADVERTISE_HOST_ENV: host.address},
            )

        written = write_checkpoint(
            node_volume(tmp_path / "node-a", "node-a", JOB), STEP, seed=1, megabytes=2
        )
        # the copy lands in node-b's volume: node-a pushed to 10.250.37.2:7450 over the pair
        copy = tmp_path / "node-b" / "nodes" / "node-b" / peer_root(JOB, "node-a")
        copy = copy / step_dir_name(STEP)
        _until(lambda: (copy / "manifest.json").exists(), "node-b's copy of step 10", logs)
        assert file_checksums(copy) == file_checksums(written)
        # and not in node-a's own: a loopback advertisement would have made it push to itself
        assert not (tmp_path / "node-a" / "nodes" / "node-a" / "peer").exists()

        # the index, read from the first host, names node-b's copy; `goodput ckpt verify` there
        # has each holder hash its copy over the data plane, at the address the index names
        ckpt = [sys.executable, "-m", "goodput.tools.cli.main", "ckpt"]
        common = ["--json", "--job", JOB, "--nats-url", url, "--state-dir", str(tmp_path / "cli")]
        verify = [*ckpt, "verify", "--all", *common]

        def verified_on_b() -> bool:
            run = host_a.run(verify, env, timeout_s=120)
            copies = json.loads(run.stdout)["copies"] if run.returncode == 0 else []
            return any(c["tier"] == "peer" and c["holder"] == "node-b" for c in copies)

        _until(verified_on_b, "the index to name node-b's verified copy", logs)
        run = host_a.run(verify, env, timeout_s=120)
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
        report = json.loads(run.stdout)
        assert report["authenticated"] is True
        assert report["copies"] and all(c["ok"] for c in report["copies"]), report
        # the nodes' addresses in the index, read from the second host
        run = host_b.run([*ckpt, "ls", *common], env, timeout_s=120)
        assert run.returncode == 0, run.stderr
        announced = {n["node"]: (n["host"], n["port"]) for n in json.loads(run.stdout)["nodes"]}
        assert announced == {node: (host.address, PEER_PORT) for node, host in nodes.items()}


@pytest.mark.slow
def test_a_one_machine_stack_on_a_remote_bus_announces_loopback(tmp_path: Path) -> None:
    """`goodput up --nats-url` with the bus on another host runs every node here: it names
    loopback for its replicators, which start (a loopback they would otherwise refuse)."""
    password = secrets.token_hex(16)
    with two_hosts() as (bus_host, stack_host):
        url = f"nats://{bus_host.address}:{NATS_PORT}"
        _start_bus(bus_host, tmp_path, password)
        env = {
            **os.environ,
            ENV_VARS["user"]: "goodput",
            ENV_VARS["password"]: password,
            "PYTHONUNBUFFERED": "1",
        }
        env.pop(ADVERTISE_HOST_ENV, None)
        cli = [sys.executable, "-m", "goodput.tools.cli.main"]
        state = ["--state-dir", str(tmp_path / "stack")]
        stack = [*state, "--nats-url", url]
        try:
            up = stack_host.run(
                [*cli, "up", *stack, "--job", JOB, "--nodes", "2", "--wait", "60"],
                env,
                timeout_s=WAIT_S,
            )
            assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
            ls = [*cli, "ckpt", "ls", "--json", "--job", JOB, *stack]

            def announced() -> dict[str, tuple[str, int]]:
                run = stack_host.run(ls, env, timeout_s=60)
                assert run.returncode == 0, run.stderr
                return {n["node"]: (n["host"], n["port"]) for n in json.loads(run.stdout)["nodes"]}

            logs = sorted((tmp_path / "stack" / "logs").glob("replicator-*.log"))
            _until(lambda: len(announced()) == 2, "both replicators announced", logs)
            nodes = announced()
            assert {host for host, _ in nodes.values()} == {"127.0.0.1"}
            assert len({port for _, port in nodes.values()}) == 2
        finally:
            down = stack_host.run([*cli, "down", *state], env, timeout_s=WAIT_S)
        assert down.returncode == 0, f"{down.stdout}\n{down.stderr}"
