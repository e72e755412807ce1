"""``python -m goodput.checkpoint.tiers.peer --root DIR``: run a peer data-plane server.

Prints ``LISTENING <host> <port>`` on stdout once it accepts connections (how a parent
process learns an ephemeral port), then serves until terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from goodput.checkpoint.tiers.peer.server import PeerServer


async def serve(root: Path, host: str, port: int) -> None:
    async with PeerServer(root, host, port) as server:
        print(f"LISTENING {server.host} {server.port}", flush=True)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, required=True, help="directory served to peers")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (loopback default)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.root, args.host, args.port))


if __name__ == "__main__":
    main()
