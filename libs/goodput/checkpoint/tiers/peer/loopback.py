"""Raw TCP bandwidth between two processes: the ceilings the data plane is measured against.

``measure_tcp_gbps`` starts ``python -m goodput.checkpoint.tiers.peer.loopback`` as a sink and sends
it bytes from memory over ``streams`` connections at once (as many as a push uses): no
hashing, no protocol. The sink either discards what it receives (what the network path
itself can carry) or, with ``to_file``, lands it in one file per connection and fsyncs
them: ``direct=True`` the way the data plane's receiver does (a writer thread per
connection, O_DIRECT, overlapping the receipt of the next buffer: what any replication that
lands durably on that disk could reach at best), ``direct=False`` the naive way (write
through the page cache after each receive, fsync at the end).
"""

from __future__ import annotations

import argparse
import mmap
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from goodput.checkpoint.format import write_all
from goodput.checkpoint.tiers.peer.channel import BUFFER_BYTES, BUFFER_COUNT, FileSink

TOTAL = struct.Struct(">Q")


def measure_tcp_gbps(
    total_bytes: int,
    host: str = "127.0.0.1",
    to_file: Path | None = None,
    direct: bool = True,
    streams: int = 1,
) -> float:
    """Send ``total_bytes`` (split over ``streams`` connections) to a sink process; return
    GB/s (10^9 bytes per second) from the first byte sent to the last acknowledgement."""
    file_args = ["--to-file", str(to_file)] if to_file is not None else []
    mode_args = [] if direct else ["--buffered"]
    sink = subprocess.Popen(
        [
            *(sys.executable, "-m", "goodput.checkpoint.tiers.peer.loopback", "--host", host),
            *("--streams", str(streams), *file_args, *mode_args),
        ],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert sink.stdout is not None
        port = int(sink.stdout.readline().split()[-1])
        payload = memoryview(mmap.mmap(-1, BUFFER_BYTES))
        shares = [total_bytes // streams + (i < total_bytes % streams) for i in range(streams)]
        socks = [socket.create_connection((host, port)) for _ in shares]
        errors: list[BaseException] = []

        def send(sock: socket.socket, count: int) -> None:
            try:
                sock.sendall(TOTAL.pack(count))
                while count:
                    chunk = payload[: min(BUFFER_BYTES, count)]
                    sock.sendall(chunk)
                    count -= len(chunk)
                if sock.recv(1) != b"k":
                    raise ConnectionError("loopback sink did not acknowledge")
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=send, args=pair) for pair in zip(socks, shares, strict=True)
        ]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        for sock in socks:
            sock.close()
        if errors:
            raise errors[0]
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


def _receive(sock: socket.socket, path: Path | None, direct: bool) -> None:
    (remaining,) = TOTAL.unpack(_recv_exact(sock, TOTAL.size))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if path else None
    free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
    for _ in range(BUFFER_COUNT if direct else 1):
        free.put(mmap.mmap(-1, BUFFER_BYTES))
    filled: queue.SimpleQueue[tuple[mmap.mmap, int] | None] = queue.SimpleQueue()

    def write_loop(sink: FileSink) -> None:
        while (item := filled.get()) is not None:
            sink.write(memoryview(item[0])[: item[1]])
            free.put(item[0])

    writer = None
    if fd is not None and direct:
        writer = threading.Thread(target=write_loop, args=(FileSink(fd),))
        writer.start()
    try:
        while remaining:
            buffer = free.get()
            n = sock.recv_into(buffer, min(BUFFER_BYTES, remaining), socket.MSG_WAITALL)
            if not n:
                raise ConnectionError("sender hung up")
            remaining -= n
            if writer is not None:
                filled.put((buffer, n))
                continue
            if fd is not None:
                write_all(fd, memoryview(buffer)[:n])
            free.put(buffer)
    finally:
        if writer is not None:
            filled.put(None)
            writer.join()
    if fd is not None:
        os.fsync(fd)
        os.close(fd)
    sock.sendall(b"k")


def serve_once(host: str, to_file: Path | None, direct: bool, streams: int) -> None:
    with socket.create_server((host, 0)) as listener:
        print(f"LISTENING {host} {listener.getsockname()[1]}", flush=True)
        socks = [listener.accept()[0] for _ in range(streams)]
    paths = [
        None if to_file is None else to_file.with_name(f"{to_file.name}.{i}")
        for i in range(streams)
    ]
    threads = [
        threading.Thread(target=_receive, args=(sock, path, direct))
        for sock, path in zip(socks, paths, strict=True)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for sock in socks:
            sock.close()
        for path in paths:
            if path is not None:
                path.unlink(missing_ok=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one-shot TCP sink for measure_tcp_gbps")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--to-file", type=Path, help="write (and fsync) what is received")
    parser.add_argument("--buffered", action="store_true", help="through the page cache")
    parser.add_argument("--streams", type=int, default=1, help="connections to accept")
    arguments = parser.parse_args()
    serve_once(arguments.host, arguments.to_file, not arguments.buffered, arguments.streams)
