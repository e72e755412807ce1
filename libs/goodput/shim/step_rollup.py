"""A node's step reports rolled up by its first local rank before they reach JetStream.

Every rank used to publish a ``StepDone`` per step into JetStream: 16 k events a second at
16,384 ranks, most of what the sensor was sent. Now each rank hands its report to its node's
local rank 0 over a node-local channel, and that rank's link publishes one ``StepsDone`` per
node per step (``schemas.steps``): once every local rank's report of the step is in, or after
:data:`GRACE_S` with what it has (a report that comes later rides in the next rollup).

The channel is a Unix datagram socket in the Linux abstract namespace, named from the job,
attempt and node and the bus (:func:`channel_name`): no file to create or clean up, no path length limit,
and the ranks of a node share a network namespace in every backend (a Kubernetes pod, a Slurm
host; the local backend's "nodes" are processes of one machine, told apart by the name's
node). The receiver takes a datagram only from its own user (``SO_PASSCRED``) and only a
``StepDone`` of its job and node that decodes strictly; anything else is dropped and counted,
never raised. A rank whose send fails (no aggregator bound: not up yet, restarting, dead; its
queue full past :data:`SEND_TIMEOUT_S`) publishes its ``StepDone`` itself, as before: both
shapes are valid on the wire, and nothing is lost.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from goodput import schemas

log = logging.getLogger(__name__)

#: how long a step's rollup waits for the node's other ranks before it goes with what it has
GRACE_S = 0.5
#: the longest a rank's send waits for room in the aggregator's queue (the kernel queues a
#: few datagrams, ``net.unix.max_dgram_qlen``); past it the rank publishes the report itself
SEND_TIMEOUT_S = 0.002
#: how often the aggregator looks for a rollup whose grace ran out
TICK_S = 0.05
#: the largest datagram taken: a ``StepDone`` is about 160 bytes
MAX_DATAGRAM = 4096
#: steps remembered as sent: a report of one of them is late and rides in the next rollup
SENT_MEMORY = 64
_UCRED = struct.Struct("3i")  # pid, uid, gid


def channel_name(bus_url: str, job: str, attempt: int, node: str) -> bytes:
    """The abstract socket address of ``node``'s aggregator in ``attempt`` of ``job`` on the
    bus at ``bus_url``: a hash, so any name fits; a later attempt never reaches an earlier
    one's rank, nor a job of the same name on another bus (two stacks on one machine, as the
    local backend's tests run side by side) another's."""
    key = "\0".join((bus_url, job, str(attempt), node))
    digest = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
    return b"\0goodput-steps-" + digest.encode()


class StepSender:
    """A rank's end of its node's channel (the trainer's thread sends on it)."""

    def __init__(self, address: bytes):
        self.address = address
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.settimeout(SEND_TIMEOUT_S)

    def send(self, report: schemas.StepDone) -> bool:
        """Hand ``report`` to the node's aggregator; False: it cannot take it (publish it)."""
        try:
            self._socket.sendto(schemas.encode(report), self.address)
        except OSError:  # refused (none bound), broken pipe (closing), timed out (queue full)
            return False
        return True

    def close(self) -> None:
        self._socket.close()


@dataclass
class Rollup:
    """The reports received and not yet sent, and when each rollup is due: the pure part."""

    ranks: int
    grace_ns: int = int(GRACE_S * 1e9)
    #: step -> rank -> report, and when the step's first report arrived
    pending: dict[int, dict[int, schemas.StepDone]] = field(default_factory=dict)
    first_ns: dict[int, int] = field(default_factory=dict)
    #: reports of steps already sent, and when the first of them arrived
    late: list[schemas.StepDone] = field(default_factory=list)
    late_ns: int = 0
    #: the ranks of each step sent lately (the newest :data:`SENT_MEMORY` steps)
    sent: dict[int, set[int]] = field(default_factory=dict)

    def add(self, report: schemas.StepDone, now_ns: int) -> None:
        ranks = self.sent.get(report.step)
        if ranks is not None and report.rank not in ranks:  # its step went without it
            if not self.late:
                self.late_ns = now_ns
            self.late.append(report)
            ranks.add(report.rank)
            return
        if ranks is not None:  # the step again (training went back to a checkpoint)
            del self.sent[report.step]
        self.first_ns.setdefault(report.step, now_ns)
        self.pending.setdefault(report.step, {})[report.rank] = report

    def due(self, now_ns: int, *, everything: bool = False) -> list[schemas.StepDone]:
        """The reports to send now, oldest step first: every step all ranks reported or whose
        grace ran out, with the late reports; none unless one of those is due."""
        steps = [
            step
            for step, reports in self.pending.items()
            if everything
            or len(reports) >= self.ranks
            or now_ns - self.first_ns[step] >= self.grace_ns
        ]
        late_due = bool(self.late) and (everything or now_ns - self.late_ns >= self.grace_ns)
        if not steps and not late_due:
            return []
        reports, self.late = self.late, []
        for step in sorted(steps):
            group = self.pending.pop(step)
            reports.extend(group[rank] for rank in sorted(group))
            del self.first_ns[step]
            self.sent[step] = set(group)
            if len(self.sent) > SENT_MEMORY:
                del self.sent[next(iter(self.sent))]
        return reports

    def next_due_ns(self) -> int | None:
        starts = [*self.first_ns.values(), *([self.late_ns] if self.late else [])]
        return min(starts) + self.grace_ns if starts else None


def rolled_up(
    job: str, node: str, rank: int, reports: list[schemas.StepDone]
) -> list[schemas.StepsDone]:
    """``reports`` as the rollups ``rank`` (the node's first) publishes: one, or several when
    more than a rollup may carry are due at once."""
    limit = schemas.MAX_ROLLED_UP
    return [
        schemas.StepsDone(
            job=job,
            node=node,
            rank=rank,
            steps=[schemas.rank_step(r) for r in reports[start : start + limit]],
        )
        for start in range(0, len(reports), limit)
    ]


class StepAggregator:
    """Local rank 0's receiver: takes the node's reports, hands each due rollup to ``emit``
    (the link's event queue), on a thread of its own so a busy bus loop never fills the
    kernel's queue. ``bind`` returns None when another process holds the channel."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        job: str,
        node: str,
        rank: int,
        ranks: int,
        emit: Callable[[schemas.StepsDone], None],
    ):
        self.job, self.node, self.rank = job, node, rank
        self.rollup = Rollup(ranks=ranks)
        #: datagrams dropped: from another user, undecodable, or another job's or node's
        self.refused = 0
        self._socket = sock
        self._emit = emit
        self._uid = os.getuid()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._main, name="goodput-step-rollup", daemon=True)
        self._thread.start()

    @classmethod
    def bind(
        cls,
        address: bytes,
        *,
        job: str,
        node: str,
        rank: int,
        ranks: int,
        emit: Callable[[schemas.StepsDone], None],
    ) -> StepAggregator | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(address)
        except OSError as exc:
            sock.close()
            log.warning("steps are not rolled up on this node (its channel: %s)", exc)
            return None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        return cls(sock, job=job, node=node, rank=rank, ranks=ranks, emit=emit)

    def close(self, timeout_s: float = GRACE_S + 1.0) -> None:
        """Send what is pending (waiting up to the grace for the node's last step), refuse
        further reports (their senders publish them) and stop the thread."""
        self._closing.set()
        self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            self._receive_until_closing()
            # the node's ranks end the job together: give its last step its grace
            deadline = time.monotonic() + GRACE_S
            while self.rollup.pending and time.monotonic() < deadline:
                self._receive_one(TICK_S)
                self._flush(time.time_ns())
            self._socket.shutdown(socket.SHUT_RD)  # senders now get EPIPE and publish
            self._socket.setblocking(False)
            while self._receive_one(None):
                pass
            self._flush(time.time_ns(), everything=True)
        except Exception:  # telemetry never stops training; its senders fall back
            log.exception("the node's step rollup stopped")
        finally:
            self._socket.close()

    def _receive_until_closing(self) -> None:
        while not self._closing.is_set():
            due = self.rollup.next_due_ns()
            wait_s = TICK_S if due is None else min(TICK_S, max(0, due - time.time_ns()) / 1e9)
            self._receive_one(wait_s)
            self._flush(time.time_ns())

    def _receive_one(self, timeout_s: float | None) -> bool:
        """Take one datagram if one comes within ``timeout_s`` (None: already queued)."""
        if timeout_s is not None:
            self._socket.settimeout(max(timeout_s, 1e-4))
        try:
            data, ancillary, _, _ = self._socket.recvmsg(
                MAX_DATAGRAM, socket.CMSG_SPACE(_UCRED.size)
            )
        except (TimeoutError, BlockingIOError):
            return False
        report = self._accepted(data, ancillary)
        if report is None:
            self.refused += 1
        else:
            self.rollup.add(report, time.time_ns())
        return True

    def _accepted(
        self, data: bytes, ancillary: list[tuple[int, int, bytes]]
    ) -> schemas.StepDone | None:
        uid = next(
            (
                _UCRED.unpack(payload[: _UCRED.size])[1]
                for level, kind, payload in ancillary
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
            ),
            None,
        )
        if uid != self._uid:
            return None
        try:
            report = schemas.decode_step(data)
        except schemas.SchemaError:
            return None
        if report.job != self.job or report.node != self.node:
            return None
        return report

    def _flush(self, now_ns: int, *, everything: bool = False) -> None:
        reports = self.rollup.due(now_ns, everything=everything)
        for rollup in rolled_up(self.job, self.node, self.rank, reports):
            self._emit(rollup)
