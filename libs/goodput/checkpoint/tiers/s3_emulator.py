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
import sys
import tempfile
from pathlib import Path
from typing import Any

from goodput.checkpoint.tiers.emulator_process import EmulatorProcess
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


class MotoS3Server(EmulatorProcess):
    """One moto server process on loopback."""

    name = "moto server"
    ready_path = "/moto-api/"
    start_timeout_s = 30.0
    poll_s = 0.1

    def command(self) -> list[str]:
        if importlib.util.find_spec("moto") is None:
            raise SystemExit(MISSING)
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]

    def client(self) -> Any:
        """A boto3 client of this server (credentials: :data:`EMULATOR_ENV`, set by the test)."""
        return s3_client(self.url)

    def store_uri(self, bucket: str, prefix: str = "") -> StoreUri:
        """The URI of ``bucket`` (under ``prefix``) on this server."""
        return StoreUri("s3", bucket, prefix, self.url)


def ensure_bucket(client: Any, name: str) -> None:
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=name)
