"""The Kubernetes backend through the REAL ``kubernetes`` client, over HTTP, to a FAKE API server.

No Kubernetes cluster can run here. ``StandInApiServer`` is a small HTTP server answering
only the REST calls the backend makes (list nodes; list, watch, create and delete pods;
create a service), so that the real client's serialization, its strictly typed API methods,
``kubernetes.watch.Watch`` (chunked watch stream) and the kubeconfig loading are exercised
as they would be against a cluster. It is a stand-in, not an API server: no scheduler, and
the kubelet's part reduced to two behaviours. A pod on a live node that is deleted stops at
once (exit 0 when given more than a second to save, else SIGKILL) and goes away. A pod on a
node in ``dead_nodes`` has no kubelet to stop it: a delete with a grace period only marks it
Terminating (``deletionTimestamp``) and it stays so forever, as against a real API server
whose node is gone; only a delete with grace period 0 (force) removes it. No kube-apiserver
can be installed here (Debian packages etcd, not the API server; PyPI has neither), so the
backend has NOT been run against a real cluster here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from goodput import schemas
from goodput.bus import BusSettings
from goodput_services.actuator.kubernetes_backend import KubernetesBackend, KubernetesOptions
from goodput_services.actuator.ports import BusPorts
from tests.actuator.kubernetes_fake import Recorder

JOB = "wire"
NAMESPACE = "goodput"
NODES = ["gpu-b", "gpu-a", "gpu-c"]


def _terminated(exit_code: int) -> dict[str, Any]:
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [
            {
                "name": "trainer",
                "image": "trainer:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": exit_code}},
            }
        ],
    }


class StandInApiServer:
    """FAKE Kubernetes API server: pods as the JSON the client sent, events to every watcher."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []
        self.deletions: list[tuple[str, str]] = []  # (pod name, gracePeriodSeconds)
        #: nodes whose kubelet is gone: their pods never finish terminating by themselves
        self.dead_nodes: set[str] = set()
        self.services: list[dict[str, Any]] = []
        self.watchers: list[queue.Queue[dict[str, Any] | None]] = []
        self.watching = threading.Event()
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> StandInApiServer:
        self.thread.start()
        return self

    def close(self) -> None:
        with self.lock:
            for watcher in self.watchers:
                watcher.put(None)
        self.httpd.shutdown()
        self.httpd.server_close()

    def publish(self, kind: str, pod: dict[str, Any]) -> None:
        with self.lock:
            for watcher in self.watchers:
                watcher.put({"type": kind, "object": json.loads(json.dumps(pod))})

    def exit(self, name: str, exit_code: int) -> None:
        """A rank's container terminated by itself."""
        self.pods[name]["status"] = _terminated(exit_code)
        self.publish("MODIFIED", self.pods[name])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the watch stream is chunked

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                if url.path == "/api/v1/nodes":
                    self._send(200, {"kind": "NodeList", "items": [_node(n) for n in NODES]})
                elif url.path == f"/api/v1/namespaces/{NAMESPACE}/pods":
                    if query.get("watch") == ["true"]:
                        self._watch()
                    else:
                        items = list(server.pods.values())
                        self._send(200, {"metadata": {"resourceVersion": "1"}, "items": items})
                else:
                    self._send(404, {"reason": "NotFound"})

            def _watch(self) -> None:
                events: queue.Queue[dict[str, Any] | None] = queue.Queue()
                with server.lock:
                    server.watchers.append(events)
                server.watching.set()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while (event := events.get()) is not None:
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def do_POST(self) -> None:
                body = self._body()
                if self.path == f"/api/v1/namespaces/{NAMESPACE}/pods":
                    if body["metadata"]["name"] in server.pods:
                        self._send(409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})
                        return
                    body["status"] = {"phase": "Pending"}
                    server.pods[body["metadata"]["name"]] = body
                    server.created.append(body)
                    server.publish("ADDED", body)
                elif self.path == f"/api/v1/namespaces/{NAMESPACE}/services":
                    server.services.append(body)
                self._send(201, body)

            def do_DELETE(self) -> None:
                url = urlparse(self.path)
                name = url.path.rsplit("/", 1)[-1]
                if url.path == f"/api/v1/namespaces/{NAMESPACE}/services/{name}":
                    kept = [s for s in server.services if s["metadata"]["name"] != name]
                    found = len(kept) < len(server.services)
                    server.services[:] = kept
                    self._send(200 if found else 404, {"kind": "Status", "code": 404})
                    return
                grace = parse_qs(url.query).get("gracePeriodSeconds", [""])[0]
                pod = server.pods.get(name)
                if pod is None:
                    self._send(404, {"kind": "Status", "reason": "NotFound", "code": 404})
                    return
                server.deletions.append((name, grace))
                if _pinned_node(pod) in server.dead_nodes and int(grace) > 0:
                    # no kubelet confirms the containers stopped: Terminating, for good
                    metadata = pod["metadata"]
                    if "deletionTimestamp" not in metadata:
                        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                        metadata["deletionGracePeriodSeconds"] = int(grace)
                        server.publish("MODIFIED", pod)
                    self._send(200, pod)
                    return
                del server.pods[name]
                self._send(200, pod)
                alive = _pinned_node(pod) not in server.dead_nodes
                if alive and pod["status"]["phase"] == "Pending":
                    pod["status"] = _terminated(0 if int(grace) > 1 else 137)
                    server.publish("MODIFIED", pod)
                server.publish("DELETED", pod)

        return Handler


def _pinned_node(pod: dict[str, Any]) -> str:
    """The node a rank pod is pinned to (where a scheduler would bind it)."""
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return terms[0]["matchFields"][0]["values"][0]


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"goodput.dev/pool": "gpu"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.fixture
async def wired(
    tmp_path: Path, monkeypatch
) -> AsyncIterator[tuple[KubernetesBackend, StandInApiServer, Recorder]]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    server = StandInApiServer().start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: standin\n"
        f"clusters: [{{name: standin, cluster: {{server: '{server.url}'}}}}]\n"
        "users: [{name: me, user: {token: abc}}]\n"
        "contexts: [{name: standin, context: {cluster: standin, user: me}}]\n"
    )
    options = KubernetesOptions.from_mapping(
        {"image": "trainer:1", "namespace": NAMESPACE, "kubeconfig": str(kubeconfig)}
    )
    recorder = Recorder()
    backend = KubernetesBackend.connect(
        job=JOB,
        bus_settings=BusSettings(url="nats://bus:4222"),
        ports=BusPorts(emit=recorder),
        options=options,
    )
    yield backend, server, recorder
    await backend.shutdown()
    server.close()


async def test_pods_go_over_the_wire_and_terminations_come_back_through_the_watch(wired):
    backend, server, recorder = wired
    start = schemas.StartJob(job=JOB, argv=["python", "train.py"], nodes=2, procs_per_node=1)
    await backend.start_job(start)
    pod = server.pods[backend.pod_name(1, 1)]
    # the JSON the API server receives is Kubernetes-shaped (camelCase, nested as expected)
    spec = pod["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-b"]
    assert spec["volumes"][0]["hostPath"]["type"] == "DirectoryOrCreate"
    assert spec["restartPolicy"] == "Never" and spec["subdomain"] == "wire-ranks"
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert (
        env["RANK"] == "1"
        and env["MASTER_ADDR"] == f"{backend.pod_name(1, 0)}.wire-ranks.goodput.svc"
    )
    assert server.services[0]["spec"]["clusterIP"] == "None"

    assert await asyncio.to_thread(server.watching.wait, 30)
    server.exit(backend.pod_name(1, 1), 1)
    crashed = await recorder.wait_for(lambda e: isinstance(e, schemas.RankExited))
    assert (crashed.rank, crashed.exit_code, crashed.node) == (1, 1, "gpu-b")

    await backend.restart("rank 1 failed")
    assert sorted(server.deletions) == [
        (backend.pod_name(1, 0), "1"),
        (backend.pod_name(1, 1), "1"),
    ]
    assert sorted(server.pods) == [backend.pod_name(2, 0), backend.pod_name(2, 1)]
    killed = await recorder.wait_for(
        lambda e: isinstance(e, schemas.RankExited) and e.expected_reason == "restart"
    )
    assert (killed.rank, killed.signal) == (0, 9)

    await backend.stop("test over")  # nothing of the job is left on the API server
    assert server.pods == {} and server.services == []


def _two_nodes_of_two_ranks() -> schemas.StartJob:
    """gpu-a runs ranks 0 and 1, gpu-b ranks 2 and 3, gpu-c waits as the spare."""
    return schemas.StartJob(
        job=JOB, argv=["python", "train.py"], nodes=2, procs_per_node=2, spares=1
    )


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (lambda backend: backend.hot_swap("gpu-a", "", "gpu-a not ready"), "hot_swap"),
        (lambda backend: backend.scale_to([], ["gpu-a"], "gpu-a not ready"), "scale_down"),
    ],
    ids=["hot_swap", "scale_down"],
)
async def test_pods_of_a_node_declared_failed_are_force_deleted_and_their_exits_reported(
    wired, command, why
):
    backend, server, recorder = wired
    await backend.start_job(_two_nodes_of_two_ranks())
    assert await asyncio.to_thread(server.watching.wait, 30)
    server.dead_nodes.add("gpu-a")  # its pods would stay Terminating for good

    await command(backend)
    # gpu-a's pods are force-deleted (grace 0), not waited for; gpu-b's stop as before
    assert sorted(server.deletions) == [
        (backend.pod_name(1, 0), "0"),
        (backend.pod_name(1, 1), "0"),
        (backend.pod_name(1, 2), "1"),
        (backend.pod_name(1, 3), "1"),
    ]
    assert not [name for name in server.pods if name.startswith(backend.pod_name(1, 0)[:-2])]
    # the exits of gpu-a's ranks are on record before the command returns
    lost = [e for e in recorder.events if isinstance(e, schemas.RankExited) and e.node == "gpu-a"]
    assert sorted((e.rank, e.attempt, e.signal, e.expected_reason) for e in lost) == [
        (0, 1, 9, why),
        (1, 1, 9, why),
    ]
    assert backend.attempt == 2 and backend.state == "running"


async def test_a_node_that_never_confirms_deletion_is_bounded_reported_and_suspect(wired):
    backend, server, recorder = wired
    backend.pods.margin_s = 0.5  # how long past the 1 s grace a deletion may take here
    await backend.start_job(_two_nodes_of_two_ranks())
    assert await asyncio.to_thread(server.watching.wait, 30)
    server.dead_nodes.add("gpu-a")
    # a restart before anyone knows gpu-a is dead: its pods stay Terminating, no exit comes
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="no pod placed: gpu-a never confirmed the deletion"):
        await backend.restart("collective timeout")
    assert time.monotonic() - started < 10  # bounded: 1 s grace + 0.5 s, not 31 s
    assert {backend.pod_name(1, 0), backend.pod_name(1, 1)} <= set(server.pods)
    # its ranks' exits are reported as lost (no code, no signal); no pod went to gpu-a
    lost = [e for e in recorder.events if isinstance(e, schemas.RankExited) and e.node == "gpu-a"]
    assert sorted((e.rank, e.exit_code, e.signal, e.expected_reason) for e in lost) == [
        (0, None, None, "restart"),
        (1, None, None, "restart"),
    ]
    on_a = sorted(name for name, p in server.pods.items() if _pinned_node(p) == "gpu-a")
    assert on_a == [backend.pod_name(1, 0), backend.pod_name(1, 1)]
    status = [e for e in recorder.events if isinstance(e, schemas.JobStatus)][-1]
    assert "gpu-a never confirmed the deletion" in status.detail

    # declared failed: its pods are force-deleted, the job goes on without it
    await backend.hot_swap("gpu-a", "", "gpu-a not ready")
    forced = sorted(name for name, grace in server.deletions if grace == "0")
    assert forced == [backend.pod_name(1, 0), backend.pod_name(1, 1)]
    assert sorted(server.pods) == [backend.pod_name(2, r) for r in range(4)]
    assert not {_pinned_node(p) for p in server.pods.values()} & {"gpu-a"}
    assert len([e for e in recorder.events if isinstance(e, schemas.RankExited)]) == 4


async def test_shutdown_stops_the_pod_watch_without_reporting_an_interruption(wired, caplog):
    backend, server, _ = wired
    caplog.set_level(logging.WARNING)
    await backend.start_job(
        schemas.StartJob(job=JOB, argv=["python", "train.py"], nodes=1, procs_per_node=1)
    )
    assert await asyncio.to_thread(server.watching.wait, 30)
    await backend.shutdown()
    for thread in threading.enumerate():
        if thread.name == "pod-watch":
            await asyncio.to_thread(thread.join, 30)
    assert not [r for r in caplog.records if "pod watch interrupted" in r.getMessage()]
