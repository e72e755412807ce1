"""A TCP relay that forwards at most a byte budget one way, then drops the rest that way.

A test that kills a receiving peer "part way" cannot count on noticing the moment in time: the
peer client sends from worker threads, its progress reaches the event loop later, and on two
loaded cores a watching thread may first run once everything has arrived. Through this relay
the receiver gets at most ``budget`` bytes over all its connections, whatever the scheduling.
Real bytes over real sockets; the other direction is relayed in full.
"""

from __future__ import annotations

import asyncio
import contextlib

#: bytes read at a time, each way
CHUNK = 1 << 16


class BudgetRelay:
    """``host:port`` relays to ``upstream``; ``exhausted`` is set once ``budget`` bytes went
    to the upstream (``to_upstream``) or from it to the clients."""

    def __init__(
        self, upstream_host: str, upstream_port: int, budget: int, *, to_upstream: bool = True
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.to_upstream = to_upstream
        self.remaining = budget
        self.exhausted = asyncio.Event()
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> BudgetRelay:
        self._server = await asyncio.start_server(self._relay, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection(*self.upstream)
        up = asyncio.create_task(self._pump(client_r, upstream_w, limited=self.to_upstream))
        down = asyncio.create_task(self._pump(upstream_r, client_w, limited=not self.to_upstream))
        self._pumps |= {up, down}
        # either end gone (the peer killed, the client done): the other sees its connection end
        _, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for pump in pending:
            pump.cancel()
        for writer in (client_w, upstream_w):
            writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, limited: bool
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                want = min(CHUNK, self.remaining) if limited else CHUNK
                if want == 0:  # spent: what comes this way is dropped, its end still seen
                    self.exhausted.set()
                    if not await reader.read(CHUNK):
                        return
                    continue
                if limited:
                    self.remaining -= want  # reserved before the read: pumps run interleaved
                data = await reader.read(want)
                if limited:
                    self.remaining += want - len(data)
                if not data:
                    return
                writer.write(data)
                await writer.drain()
