"""A store emulator's server process on loopback, for tests and benchmarks: started, awaited
until its HTTP endpoint answers, stopped; its output kept for the one line that says why it
did not come up.

fake-gcs-server (:mod:`fake_gcs`) and moto's S3 server (:mod:`s3_emulator`) differ only in
the command that starts them and the URL that answers once they serve; the life cycle is this
one class's.
"""

from __future__ import annotations

import abc
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Self

from goodput.bus.embedded import free_port


class EmulatorProcess(abc.ABC):
    """One emulator server process; subclasses name it and say how it starts and answers."""

    #: the server's name in errors
    name = "emulator"
    #: the path that answers 200 once the server serves
    ready_path = "/"
    #: how long :meth:`start` waits by default, and between readiness polls
    start_timeout_s = 20.0
    poll_s = 0.05

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

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The server's command line (having put in place what it needs to start)."""

    def start(self, timeout_s: float | None = None) -> None:
        if self.running:
            return
        timeout_s = self.start_timeout_s if timeout_s is None else timeout_s
        self._process = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(self.poll_s)
        self.stop()
        raise RuntimeError(f"{self.name} not ready in {timeout_s}s: {self._log_tail()}")

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

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        self._log.close()
