"""The watch on a job's pods: a thread around the blocking client, feeding the event loop.

It lists the pods, then watches from that listing's version; after every timeout or error it
lists again, so a change made while the watch was down is still seen (as a listing).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from goodput_services.actuator.kubernetes_pods import PodApi

log = logging.getLogger(__name__)

#: the watch is re-established (with a fresh list, so nothing is missed) this often
WATCH_PERIOD_S = 300
WATCH_RETRY_S = 2.0
#: how long stopping waits for the thread; a stop that raced the watch's connect is repeated
STOP_WAIT_S = 10.0

#: ("LIST", [pods]) or (watch event type, pod)
PodEvent = tuple[str, Any]


class PodWatch(Protocol):
    """What ``kubernetes.watch.Watch`` offers: a stream of ``{"type", "object"}`` events."""

    def stream(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[dict]: ...

    def stop(self) -> None: ...


class PodWatcher:
    """Lists and watches the pods matching ``selector``; puts each change on ``queue``."""

    def __init__(
        self,
        api: PodApi,
        namespace: str,
        selector: str,
        watch_factory: Callable[[], PodWatch],
    ):
        self.api = api
        self.namespace = namespace
        self.selector = selector
        self.watch_factory = watch_factory
        self._stopping = threading.Event()
        self._watch: PodWatch | None = None
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[PodEvent]) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(loop, queue), name="pod-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Blocking: end the watch (its connection is shut) and wait for the thread to leave.

        ``Watch.stop`` only takes hold once the stream has its response, so it is repeated
        until the thread is gone.
        """
        self._stopping.set()
        thread = self._thread
        deadline = time.monotonic() + STOP_WAIT_S
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            if self._watch is not None:
                self._watch.stop()
            thread.join(0.05)

    def _run(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[PodEvent]) -> None:
        while not self._stopping.is_set():
            try:
                listing = self.api.list_namespaced_pod(self.namespace, label_selector=self.selector)
                loop.call_soon_threadsafe(queue.put_nowait, ("LIST", listing.items))
                if listing.metadata is None:
                    raise RuntimeError("a pod listing without its resourceVersion")
                self._watch = watch = self.watch_factory()
                for event in watch.stream(
                    self.api.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=WATCH_PERIOD_S,
                    # a connection that died silently must not hold the watch forever
                    _request_timeout=WATCH_PERIOD_S + 30,
                ):
                    if self._stopping.is_set():
                        return
                    loop.call_soon_threadsafe(queue.put_nowait, (event["type"], event["object"]))
            except Exception as exc:  # API server restart, network, expired version
                if self._stopping.is_set() or loop.is_closed():
                    return  # stopping shuts the connection: not an interruption
                log.warning("pod watch interrupted (%s); listing again", exc)
                self._stopping.wait(WATCH_RETRY_S)
