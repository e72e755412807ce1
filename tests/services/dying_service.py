"""A real service process whose one loop raises (or, with ``--returns``, returns; with
``--crashes``, dies of SIGSEGV as a crash in native code would) after start-up; run by
test_service_exit."""

from __future__ import annotations

import asyncio
import faulthandler
import sys

from goodput_services.base import Service, run_service


class DyingService(Service):
    name = "dying"

    def loops(self):
        if "--crashes" in sys.argv:
            return [self._crashes()]
        return [self._returns() if "--returns" in sys.argv else self._breaks()]

    async def _crashes(self) -> None:
        await asyncio.sleep(0.2)
        faulthandler._sigsegv()

    async def _breaks(self) -> None:
        await asyncio.sleep(0.2)
        raise RuntimeError("the loop broke on purpose")

    async def _returns(self) -> None:
        await asyncio.sleep(0.2)


if __name__ == "__main__":
    sys.exit(
        run_service(DyingService, [a for a in sys.argv[1:] if a not in ("--returns", "--crashes")])
    )
