"""One failure is one incident, not a storm: which of the detector's conclusions become signals.

A node that has been reported is not reported again — unless it was for a correctable fault and
is now found lost or broken (uncorrectable): a rank silent after its hang was reported, whose
node then turns out gone, must still be replaced. While an incident is open, further
correctable failures are its collateral; a straggler is reported once per node. A rank
(re)start closes its node's incident and the job's open one, and moves the epoch (the attempt)
that signal ids are derived from.
"""

from __future__ import annotations

import msgspec

from goodput import schemas
from goodput.supervisor.detect.signals import make_signal
from goodput.supervisor.detect.thresholds import Thresholds


class Incidents:
    """The open incident, the nodes reported in it, and the signals it lets through."""

    def __init__(self, job: str):
        self.job = job
        self.open = False
        #: node -> the severity it was reported with in the current incident
        self.reported_nodes: dict[str, schemas.Severity] = {}
        self.straggler_nodes: set[str] = set()
        #: the newest attempt seen: part of every signal's identity
        self.epoch = 0

    def rank_restarted(self, node: str, attempt: int) -> None:
        """A rank of ``node`` (re)started for ``attempt``: the node's and the job's incident end."""
        self.epoch = max(self.epoch, attempt)
        self.open = False
        self.reported_nodes.pop(node, None)
        self.reported_nodes.pop("", None)  # a job-wide fault (a NaN loss): the restart ends it

    def failure(
        self,
        kind: schemas.SignalKind,
        node: str,
        rank: int | None,
        severity: schemas.Severity,
        detail: str,
        *,
        observed_ns: int,
        now: int,
    ) -> list[schemas.Signal]:
        before = self.reported_nodes.get(node)
        if before is not None and (before == "uncorrectable" or severity != "uncorrectable"):
            return []
        if severity == "correctable" and self.open:
            return []  # collateral of the open incident
        # a node lost opens one too: the ranks left waiting on it look hung next
        self.open = True
        self.reported_nodes[node] = severity
        return [self.signal(kind, node, rank, severity, detail, observed_ns=observed_ns, now=now)]

    def straggler(
        self, rank_id: int, node: str, ratio: float, t: Thresholds, now: int
    ) -> list[schemas.Signal]:
        if node in self.straggler_nodes:
            return []
        self.straggler_nodes.add(node)
        return [
            msgspec.structs.replace(
                self.signal(
                    "straggler",
                    node,
                    rank_id,
                    "info",
                    f"rank {rank_id} on {node}: compute time {ratio:.2f}× its peers' in most of "
                    f"the last {t.straggler_window} steps for {t.straggler_hold_s:g} s "
                    f"(threshold {t.straggler_ratio}×)",
                    observed_ns=now,
                    now=now,
                ),
                ratio=ratio,
            )
        ]

    def signal(
        self,
        kind: schemas.SignalKind,
        node: str,
        rank: int | None,
        severity: schemas.Severity,
        detail: str,
        *,
        observed_ns: int,
        now: int,
        host: schemas.HostHealth | None = None,
    ) -> schemas.Signal:
        return make_signal(
            self.job,
            kind,
            node,
            rank,
            severity,
            detail,
            epoch=self.epoch,
            observed_ns=observed_ns,
            now=now,
            host=host,
        )
