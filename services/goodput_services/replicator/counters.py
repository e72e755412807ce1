"""What the replicator has done, for its health record and its logs.

Hashing is counted where it happens (:func:`goodput.checkpoint.format.hash_totals`, process-wide: the
scan, the scrub and the peer server's receive checks); the replicator only reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from goodput.checkpoint.format import hash_totals
from goodput_services.replicator.holdings import Check


@dataclass
class Counters:
    replicated: int = 0
    backed_up: int = 0
    restored: int = 0
    gc_deleted: int = 0
    #: copies indexed, by how they were checked (hashed here, or trusted: sealed, received)
    checked: dict[Check, int] = field(default_factory=dict)
    last_error: str = ""

    def detail(self) -> str:
        """One line for the health record."""
        hashed = hash_totals()
        checked = ", ".join(f"{n} {how}" for how, n in sorted(self.checked.items())) or "none"
        detail = (
            f"replicated {self.replicated}, backed up {self.backed_up}, restored "
            f"{self.restored}, gc deleted {self.gc_deleted}; copies indexed: {checked}; "
            f"hashed {hashed.bytes / 1e9:.3f} GB in {hashed.cpu_s:.2f} CPU s"
        )
        if self.last_error:
            detail += f"; last error: {self.last_error}"
        return detail


def hashing_fields() -> dict[str, float]:
    """This process's hashing so far, as log fields (``goodput bench restore`` reads them)."""
    totals = hash_totals()
    return {"hashed_bytes": totals.bytes, "hash_cpu_s": round(totals.cpu_s, 6)}
