"""The stop vote, pipelined: every rank stops at the same step, and no step waits for it.

Every rank must leave the loop after the same step, or a peer waits forever in the next
collective for one that left; so "stop" (SIGTERM, a ``Stop`` or ``Rescale`` command, which
reach each rank at a different moment) is voted: the OR of every rank's flag. A blocking
all-reduce at every step's end costs two host syncs on a GPU (the flag's copy to the device,
the answer's copy back), which drain the device's queue of launched work every step.

So the ballot cast at the end of step k is launched and left in flight, and read at the end of
step k+1: every rank reads the same ballot at the same step, so every rank stops after the
same step — one step later than a blocking vote would (a SIGTERM's grace period is many
steps). Nothing in the step waits for it:

* where the group serves CUDA only (NCCL), the flag is written into a device tensor by a
  kernel (``fill_``: no copy from the host), the all-reduce is ordered on the training
  stream, and the answer is copied into pinned host memory behind a CUDA event; step k+1 reads
  it once the event has passed, which it has unless the host runs more than a step ahead of
  the device (then it waits for that one step, not for the queue). A gloo group told to serve
  CUDA only ("cuda:gloo", tests) waits for its work on the host at the launch;
* where the group serves the CPU (gloo), the all-reduce runs on gloo's threads
  (``async_op``) and step k+1 waits for its ``Work``, long finished by then unless a peer is
  a whole step behind.

A rank without peers agrees with itself at once. The ballot in flight belongs to the group it
was launched on: after an in-process restart (a new group) ``reset`` drops it on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from goodput.shim.collectives import collective_device, grouped


class _CudaBallot:
    """A ballot on a CUDA group: launched without a host sync, read once its event passed."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._vote = torch.zeros(1, dtype=torch.int64, device=device)
        self._answer = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self._done = torch.cuda.Event()

    def launch(self, flag: bool) -> None:
        self._vote.fill_(int(flag))
        # NCCL orders the collective after the current stream and the current stream after it
        # (``wait`` on a CUDA work blocks no host thread)
        dist.all_reduce(self._vote, op=dist.ReduceOp.MAX, async_op=True).wait()
        self._answer.copy_(self._vote, non_blocking=True)
        self._done.record()

    def ready(self) -> bool:
        return self._done.query()

    def result(self) -> bool:
        if not self.ready():
            self._done.synchronize()  # the host ran more than a step ahead of the device
        return bool(self._answer[0])


class _HostBallot:
    """A ballot on a group serving the CPU: gloo's threads reduce it while the step runs."""

    def __init__(self) -> None:
        self._vote = torch.zeros(1, dtype=torch.int64)
        self._work: dist.Work | None = None

    def launch(self, flag: bool) -> None:
        self._vote.fill_(int(flag))  # the previous ballot's work was waited for
        self._work = dist.all_reduce(self._vote, op=dist.ReduceOp.MAX, async_op=True)

    def ready(self) -> bool:
        return self._work is not None and self._work.is_completed()

    def result(self) -> bool:
        assert self._work is not None
        self._work.wait()
        return bool(self._vote[0])


class StopVote:
    """One rank's side of the pipelined stop vote; call :meth:`cast` at every step's end."""

    def __init__(self) -> None:
        self._ballot: _CudaBallot | _HostBallot | None = None
        self._in_flight = False
        #: ballots launched, and answers read after waiting (the host ran ahead): what a test
        #: or a benchmark reads to show the vote costs the step nothing
        self.launched = 0
        self.waited = 0

    def cast(self, stop: bool, *, last: bool = False) -> bool:
        """Whether every rank stops after this step: the previous step's ballot (OR over the
        ranks), read now; this step's ``stop`` is launched unless the loop ends here (``last``)
        or stops. Without peers, ``stop`` itself."""
        if not grouped():
            self.reset()
            return stop
        agreed = self._read()
        if not agreed and not last:
            self._launch(stop)
        return agreed

    def reset(self) -> None:
        """Forget the ballot in flight: its group is gone (no peers now)."""
        self._in_flight = False

    def _read(self) -> bool:
        if not self._in_flight:
            return False
        assert self._ballot is not None
        self._in_flight = False
        if not self._ballot.ready():
            self.waited += 1
        return self._ballot.result()

    def _launch(self, stop: bool) -> None:
        device = collective_device()
        if device.type == "cuda":
            if not isinstance(self._ballot, _CudaBallot) or self._ballot.device != device:
                self._ballot = _CudaBallot(device)
        elif not isinstance(self._ballot, _HostBallot):
            self._ballot = _HostBallot()
        self._ballot.launch(stop)
        self._in_flight = True
        self.launched += 1
