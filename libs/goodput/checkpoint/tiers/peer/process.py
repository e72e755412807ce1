"""Run a peer server in a child process (a separate node, as far as the data plane cares)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


class PeerServerProcess:
    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = Path(root)
        self.host = host
        self.port = port
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start and wait for the LISTENING line; a restart reuses the port it got first."""
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "goodput.checkpoint.tiers.peer", "--root", str(self.root)),
                *("--host", self.host, "--port", str(self.port)),
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if len(line) != 3 or line[0] != "LISTENING":
            self.process.kill()
            self._reap()
            raise RuntimeError(f"peer server did not start (said {line!r})")
        self.port = int(line[2])

    def kill(self) -> None:
        """SIGKILL: the abrupt death of a node, no cleanup on its side."""
        if self.process is not None:
            self.process.kill()
            self._reap()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self._reap()

    def _reap(self) -> None:
        assert self.process is not None
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def __enter__(self) -> PeerServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
