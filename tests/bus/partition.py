"""A TCP relay between a NATS client and a real nats-server that can cut the network.

While ``cut`` the relay keeps the connections open and throws away every byte both ways (a
partition: what the client sends in that time never arrives, and it cannot tell yet); at
``heal`` it resets them, so the client reconnects and finds what really reached the server.
Stopping the server is a different fault: a client's requests are buffered through a
reconnect and arrive late, where in a partition they are lost.
"""

from __future__ import annotations

import asyncio
import contextlib


class PartitionRelay:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.port = 0
        self.cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            w.close()
            self._writers.discard(w)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if not self.cut:
                writer.write(data)
                await writer.drain()
        writer.close()

    def partition(self) -> None:
        self.cut = True

    def heal(self) -> None:
        """Reset every connection that lived through the partition, then relay again."""
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()
        self.cut = False

    async def close(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
