"""Raw TCP bandwidth between two processes: the ceilings the data plane is measured against.

``measure_tcp_gbps`` starts ``python -m goodput.tiers.peer.loopback`` as a sink and sends
it bytes from memory: no hashing, no protocol. The sink either discards what it receives
(what the network path itself can carry) or, with ``to_file``, writes it to a file and
fsyncs it (what any replication that lands durably on that disk could reach at best).
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from goodput.tiers.checksum import write_all

BUFFER_BYTES = 8 << 20
TOTAL = struct.Struct(">Q")


def measure_tcp_gbps(
    total_bytes: int, host: str = "127.0.0.1", to_file: Path | None = None
) -> float:
    """Send ``total_bytes`` to a sink process; return GB/s (10^9 bytes per second)."""
    file_args = ["--to-file", str(to_file)] if to_file is not None else []
    sink = subprocess.Popen(
        [sys.executable, "-m", "goodput.tiers.peer.loopback", "--host", host, *file_args],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert sink.stdout is not None
        port = int(sink.stdout.readline().split()[-1])
        payload = memoryview(bytearray(BUFFER_BYTES))
        with socket.create_connection((host, port)) as sock:
            sock.sendall(TOTAL.pack(total_bytes))
            started = time.perf_counter()
            remaining = total_bytes
            while remaining:
                chunk = payload[: min(BUFFER_BYTES, remaining)]
                sock.sendall(chunk)
                remaining -= len(chunk)
            if sock.recv(1) != b"k":
                raise ConnectionError("loopback sink did not acknowledge")
            seconds = time.perf_counter() - started
        return total_bytes / seconds / 1e9
    finally:
        sink.wait(timeout=30)
        if sink.stdout is not None:
            sink.stdout.close()


def _recv_exact(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("sender hung up")
        data += chunk
    return data


def serve_once(host: str, to_file: Path | None) -> None:
    with socket.create_server((host, 0)) as listener:
        print(f"LISTENING {host} {listener.getsockname()[1]}", flush=True)
        sock, _ = listener.accept()
        fd = os.open(to_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if to_file else None
        try:
            (remaining,) = TOTAL.unpack(_recv_exact(sock, TOTAL.size))
            view = memoryview(bytearray(BUFFER_BYTES))
            while remaining:
                n = sock.recv_into(view, min(BUFFER_BYTES, remaining), socket.MSG_WAITALL)
                if not n:
                    raise ConnectionError("sender hung up")
                if fd is not None:
                    write_all(fd, view[:n])
                remaining -= n
            if fd is not None:
                os.fsync(fd)
            sock.sendall(b"k")
        finally:
            sock.close()
            if fd is not None:
                os.close(fd)
                os.unlink(to_file)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one-shot TCP sink for measure_tcp_gbps")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--to-file", type=Path, help="write (and fsync) what is received")
    arguments = parser.parse_args()
    serve_once(arguments.host, arguments.to_file)
