"""A real service process whose stop never finishes: ``--blocking`` blocks the event loop in a
native sleep, otherwise a coroutine waits forever; run by test_service_exit."""

from __future__ import annotations

import asyncio
import sys
import time

from goodput_services.base import Service, run_service


class StuckService(Service):
    name = "stuck"

    @property
    def stop_deadline_s(self) -> float:
        return 1.0

    async def on_stop(self) -> None:
        if "--blocking" in sys.argv:
            time.sleep(3600)
        await asyncio.Event().wait()


if __name__ == "__main__":
    sys.exit(run_service(StuckService, [arg for arg in sys.argv[1:] if arg != "--blocking"]))
