"""Faults injected by command (``enable_fault_injection``): reported as if the host had them.

Each fault kind is held until an ``InjectFault`` with ``clear=True`` names it (or ``all``).
The fault strings are the ones the real probes produce, so the rest of the system cannot
tell an injected fault from a real one — which is the point of injecting it.
"""

from __future__ import annotations

#: fault kind → what it stands for (the text of the command's error on an unknown kind)
KNOWN_FAULTS = {
    "gpu_xid": "a critical GPU XID error (detail: the XID code, default 79 = fell off the bus)",
    "ecc_uncorrected": "uncorrected ECC errors in GPU memory",
    "gpu_lost": "a GPU that disappeared",
    "thermal": "a GPU throttling for heat",
    "disk_full": "the checkpoint volume out of space",
    "memory_pressure": "host memory nearly exhausted",
    "node_down": "the whole node lost",
}
CLEAR_ALL = "all"
#: injected faults that stand for the GPU's state, which a GPU reset starts afresh
RESET_CLEARS = ("gpu_xid", "ecc_uncorrected")
DEFAULT_XID = "79"


class InjectionError(ValueError):
    pass


class InjectedFaults:
    def __init__(self) -> None:
        self._active: dict[str, str] = {}

    def apply(self, fault: str, detail: str, clear: bool) -> str:
        """Set or clear one fault; returns what changed, for the command's result."""
        if clear and fault == CLEAR_ALL:
            cleared = sorted(self._active)
            self._active.clear()
            return f"cleared {', '.join(cleared) or 'nothing'}"
        if fault not in KNOWN_FAULTS:
            known = ", ".join(sorted(KNOWN_FAULTS))
            raise InjectionError(f"unknown host fault {fault!r}; known: {known}")
        if clear:
            was = self._active.pop(fault, None)
            return f"cleared {fault}" if was is not None else f"{fault} was not injected"
        if fault == "gpu_xid":
            detail = detail or DEFAULT_XID
            if not detail.isdigit():
                raise InjectionError(f"gpu_xid needs a numeric XID code, got {detail!r}")
        self._active[fault] = detail
        return f"injected {self.label(fault, detail)}"

    @staticmethod
    def label(fault: str, detail: str) -> str:
        return f"gpu_xid:{detail}" if fault == "gpu_xid" else fault

    def clear_gpu(self) -> list[str]:
        """A GPU reset happened: the GPU faults it clears are gone; returns what was cleared."""
        return [f for f in RESET_CLEARS if self._active.pop(f, None) is not None]

    def faults(self) -> list[str]:
        return sorted(self.label(fault, detail) for fault, detail in self._active.items())

    def __bool__(self) -> bool:
        return bool(self._active)
