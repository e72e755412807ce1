"""A real service process whose one loop raises (or, with ``--returns``, returns) after
start-up; run by test_service_exit."""

from __future__ import annotations

import asyncio
import sys

from goodput_services.base import Service, run_service


class DyingService(Service):
    name = "dying"

    def loops(self):
        return [self._returns() if "--returns" in sys.argv else self._breaks()]

    async def _breaks(self) -> None:
        await asyncio.sleep(0.2)
        raise RuntimeError("the loop broke on purpose")

    async def _returns(self) -> None:
        await asyncio.sleep(0.2)


if __name__ == "__main__":
    sys.exit(run_service(DyingService, [arg for arg in sys.argv[1:] if arg != "--returns"]))
