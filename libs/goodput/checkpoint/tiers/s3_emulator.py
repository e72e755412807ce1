"""Run moto's S3 server (``moto[server]``) as a real local S3 endpoint for tests.

moto is a test emulator (goodput's ``dev`` extra, not a runtime dependency), so it is looked
for where a server starts, and its absence is one line naming the extra. No MinIO server
installs from PyPI or Debian; moto answers the S3 REST API over HTTP the way AWS does (SigV4
signatures, multipart uploads, paginated listings, user metadata), keeping its objects in
the server's memory: a restarted server is empty. It runs as a process of its own, so the
test process's interpreter does not serve the uploads it waits on.

Every client of the emulator, the test's own and the replicators' it starts, finds its
credentials through boto3's standard chain, as in production: :data:`EMULATOR_ENV` is what a
test puts in its environment (keys the emulator accepts, no instance-metadata lookups, no
user's ``~/.aws`` files).
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from goodput.bus.embedded import free_port
from goodput.checkpoint.tiers.s3 import s3_client
from goodput.checkpoint.tiers.store_uri import StoreUri

#: what to install where moto is missing
MISSING = (
    "moto (the S3 test emulator) is not installed here: install goodput's dev extra "
    "(./setup.sh --dev, or pip install 'goodput[dev]')"
)

#: the environment under which boto3's chain finds the emulator's (any) keys and nothing else
EMULATOR_ENV = {
    "AWS_ACCESS_KEY_ID": "goodput-test",
    "AWS_SECRET_ACCESS_KEY": "goodput-test-secret",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": str(Path(tempfile.gettempdir(), "goodput-no-aws-config")),
    "AWS_SHARED_CREDENTIALS_FILE": str(Path(tempfile.gettempdir(), "goodput-no-aws-credentials")),
}


class MotoS3Server:
    """One moto server process on loopback."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
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

    def start(self, timeout_s: float = 30.0) -> None:
        if self.running:
            return
        if importlib.util.find_spec("moto") is None:
            raise SystemExit(MISSING)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto server exited: {self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server not ready in {timeout_s}s: {self._log_tail()}")

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

    def client(self) -> Any:
        """A boto3 client of this server (credentials: :data:`EMULATOR_ENV`, set by the test)."""
        return s3_client(self.url)

    def store_uri(self, bucket: str, prefix: str = "") -> StoreUri:
        """The URI of ``bucket`` (under ``prefix``) on this server."""
        return StoreUri("s3", bucket, prefix, self.url)

    def __enter__(self) -> MotoS3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        self._log.close()


def ensure_bucket(client: Any, name: str) -> None:
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=name)
