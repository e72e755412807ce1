"""What a failed training step means for this process: the one place that reads the exception.

A step fails for three kinds of reason, and the in-process restart (:mod:`goodput.shim.inprocess`)
must treat them differently:

* **context** — a sticky CUDA error (a device-side assert, an illegal address, an uncorrectable
  ECC error…). CUDA poisons the process's context: every later CUDA call in this process fails
  with the same error, so a rank that answered the ``Rejoin`` would fail its restore or its
  next step, costing the job a failed warm round. The rank leaves at once with
  ``EXIT_CODES["cuda-context"]``; the policy restarts it cold (a new process, a new context).
* **oom** — CUDA ran out of memory. Fragmentation or a transient peak passes after the
  caches are freed and the step is retried (warm, through the rejoin, from the step every
  rank holds); a step that runs out again before passing the one that failed will do so
  every time, so the second OOM leaves with ``EXIT_CODES["cuda-oom"]``, and the policy tells
  an OOM of every rank (the job's memory) from one node's.
* **recoverable** — everything else (a peer's death failing a collective, an NCCL error, an
  aborted communicator): the warm path, as before.

torch 2.13 raises a CUDA runtime failure as ``torch.AcceleratorError`` (a ``RuntimeError``)
whose ``error_code`` is the ``cudaError_t``; an OOM as ``torch.OutOfMemoryError`` (the same
class as ``torch.cuda.OutOfMemoryError``); NCCL errors as ``torch.distributed.DistBackendError``,
whose message carries the CUDA failure when one caused it (``Cuda failure 'an illegal memory
access was encountered'``). Other code paths (a cuBLAS call, an extension, an older torch)
raise a plain ``RuntimeError`` with CUDA's message, so the messages are matched too, along
the exception's chain (``__cause__``/``__context__``).
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from typing import Literal

import torch

from goodput import schemas
from goodput.launch.rank_env import EXIT_CODES

log = logging.getLogger(__name__)

#: ``cudaError_t`` values that poison the context (CUDA runtime API, "sticky" errors), and
#: the message ``cudaGetErrorString`` gives each: what a ``RuntimeError`` without a code says
STICKY_ERRORS: dict[int, str] = {
    214: "uncorrectable ECC error encountered",
    220: "uncorrectable NVLink error detected during the execution",
    700: "an illegal memory access was encountered",
    702: "the launch timed out and was terminated",
    709: "context is destroyed",
    710: "device-side assert triggered",
    714: "hardware stack error",
    715: "an illegal instruction was encountered",
    716: "misaligned address",
    717: "operation not supported on global/shared address space",
    718: "invalid program counter",
    719: "unspecified launch failure",
}
#: how a CUDA OOM reads where it is not a ``torch.OutOfMemoryError`` (cuBLAS's workspace)
OOM_MESSAGES = ("CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED")

FaultKind = Literal["context", "oom", "recoverable"]
#: the cause a fault of each kind names in the rank's exit (``RankFault``)
RANK_FAULTS: dict[FaultKind, schemas.RankFault] = {
    "context": "cuda-context",
    "oom": "cuda-oom",
    "recoverable": "",
}


@dataclass(frozen=True)
class StepFault:
    kind: FaultKind
    #: one line for the exit reason and the log
    reason: str

    @property
    def rank_fault(self) -> schemas.RankFault:
        return RANK_FAULTS[self.kind]


def classify(failure: BaseException) -> StepFault:
    """What ``failure`` (raised in a training step) means for this process."""
    chain = _chain(failure)
    for exc in chain:
        code = getattr(exc, "error_code", None)
        if isinstance(exc, torch.AcceleratorError) and code in STICKY_ERRORS:
            return _context(STICKY_ERRORS[code], code)
        text = str(exc)
        for sticky_code, message in STICKY_ERRORS.items():
            if message in text:
                return _context(message, sticky_code)
    for exc in chain:
        if isinstance(exc, torch.OutOfMemoryError) or any(m in str(exc) for m in OOM_MESSAGES):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return StepFault("oom", f"out of GPU memory: {first}")
    return StepFault("recoverable", f"{type(failure).__name__}: {failure}")


class OomRetry:
    """One warm retry per OOM: a second OOM before the rank passed the step that failed the
    first time is deterministic (the retry restored an earlier step and ran out at the same
    place), so it goes cold; one after it passed is a new OOM with its own retry."""

    def __init__(self) -> None:
        self._retried_at: int | None = None

    def allows(self, step: int) -> bool:
        """Whether an OOM with ``step`` steps done may be retried warm (records the retry)."""
        if self._retried_at is not None and step <= self._retried_at:
            return False
        self._retried_at = step
        return True


def free_cuda_caches() -> None:
    """Give the caching allocator's free blocks back before a retry: a fragmented cache is
    the OOM a retry can cure. Nothing to free where CUDA was never initialised."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class LeaveCold(SystemExit):
    """Ends the process with the exit code of its :class:`StepFault` (a ``SystemExit``: no
    ``except Exception`` in the script keeps a poisoned process running)."""

    def __init__(self, fault: StepFault) -> None:
        self.exit_code = EXIT_CODES[fault.rank_fault]
        super().__init__(self.exit_code)
        self.fault = fault


def leave_cold(fault: StepFault) -> LeaveCold:
    """The exit for ``fault``, its reason logged as one line first (the rank log's last line,
    which ``goodput run`` shows when the ranks cannot start)."""
    log.error("leaving for a cold restart: %s", fault.reason)
    return LeaveCold(fault)


def _context(message: str, code: int) -> StepFault:
    return StepFault(
        "context",
        f"its CUDA context cannot continue: {message} (cudaError {code}, sticky: every later "
        "CUDA call of this process fails)",
    )


def _chain(failure: BaseException) -> list[BaseException]:
    """``failure`` and what caused it, nearest first (cycles cut)."""
    chain: list[BaseException] = []
    exc: BaseException | None = failure
    while exc is not None and exc not in chain and len(chain) < 16:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain
