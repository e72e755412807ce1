"""Trainer-side numerics, cheap: a window's loss and gradient norm, and the data-parallel
replicas' parameter fingerprints (issue 39; the detectors: ``supervisor/detect/numerics.py``).

**No host sync per step.** Each step adds its loss and gradient norm to accumulators on their
own device (a few tiny kernels, queued behind the step); every ``read_every`` steps the
window is reduced over the ranks and read once. Non-finite values are counted, not summed, so
the window's figures stay finite (an event log is JSON) and a NaN on any rank is seen.

**Fingerprints.** Every ``fingerprint_every`` steps (a multiple of ``read_every``: it rides
on a window's end) each rank sums the 32-bit words of its parameters into an int64, kept
modulo 2^52 so a float64 holds it exactly. A single flipped bit changes that sum by 2^k,
k < 32, so it never cancels; several flips could, by a chance of about 2^-52. Replicas of a
model-parallel slot (ranks ``slot``, ``slot + mp``, ...: ``dp_rank = rank // mp``) hold the
same parameters after the optimizer step. The comparison rides on the window's two
reductions: per slot, the largest fingerprint and the largest negated one (a SUM and a MAX
all-reduce of ``4 + 2 mp`` float64s, whatever the world size); only when a slot's extremes
differ does a third collective (an all-gather of one float64 per rank) name the groups.

**Known clean.** A window's reading is the same on every rank. The last fingerprint step at
which every replica agreed, with no window since the last restore having shown a non-finite
value or a disagreement, bounds where a numerical rollback may come back to: ``on_clean`` is
told of the step before that fingerprint's window, which the shim records in the volume so
that retention keeps a checkpoint at or before it (``goodput.checkpoint.format.clean_record``).
A loss spike is the supervisor's to judge, not the rank's: it does not stop the claim, and
its rollback goes before the window it was seen in, hence the claim stops short of the
window (a claim of the fingerprint step itself once kept only a checkpoint inside a spike's
window, and the rollback found nothing older).

Collectives run on the device the group serves (``shim/collectives.py``: CUDA tensors for
NCCL, CPU ones for gloo). Every rank must call
:meth:`NumericsMonitor.observe` at every step (the windows end at the same steps everywhere).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from goodput import schemas
from goodput.checkpoint.engine.sharded_save import is_dtensor
from goodput.shim.collectives import collective_device, grouped
from goodput.shim.replica_layout import hsdp_slots

#: a step's (step, loss, parameters) → the loss to observe, its faults applied
#: (``goodput.shim.injected_faults.InjectedFaults.at_step_boundary``)
Injection = Callable[
    [int, torch.Tensor | float, Callable[[], Iterable[torch.Tensor]] | None], torch.Tensor | float
]
#: module classes whose parameters are shards, not replicas: nothing under them is compared
SHARDING_WRAPPERS = frozenset({"FullyShardedDataParallel"})
#: fingerprints are kept modulo this, so a float64 (53-bit mantissa) holds them exactly
FINGERPRINT_MODULUS = 1 << 52
# accumulator slots: sums first (all-reduced with SUM), then maxima (MAX)
_COUNT, _LOSS_SUM, _GNORM_SUM, _NONFINITE, _LOSS_MAX, _GNORM_MAX = range(6)
_SUMS = 4


def fingerprint(parameters: Iterable[torch.Tensor], *, sharded: bool = False) -> torch.Tensor:
    """A 0-d int64 tensor on the parameters' device: the sum of their 32-bit words (16-bit
    for a tensor of an odd number of 16-bit elements) modulo 2^52. No host sync.

    Sharded parameters (DTensors: FSDP2, tensor parallelism) are left out unless ``sharded``:
    their shards differ from rank to rank by design, and which ranks hold the same shard is
    the sharding's business, not ``rank // model_parallel_size``; comparing them would find
    every replica corrupt. With ``sharded`` (an HSDP layout the monitor compares by shard:
    ``goodput.shim.replica_layout``) each DTensor's local shard is summed too."""
    total: torch.Tensor | None = None
    for parameter in parameters:
        if is_dtensor(parameter):
            if not sharded:
                continue
            parameter = parameter.to_local()
        flat = parameter.detach().contiguous().reshape(-1)
        if flat.numel() == 0:
            continue
        raw = flat.view(torch.uint8)
        words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw.view(torch.int16)
        part = words.sum(dtype=torch.int64)
        total = part if total is None else total + part
    if total is None:
        return torch.zeros((), dtype=torch.int64)
    return torch.remainder(total, FINGERPRINT_MODULUS)


def replicated(module: object) -> Callable[[], list[torch.Tensor]] | None:
    """What of ``module`` to fingerprint, looked at only when a fingerprint is due: its
    parameters, but none under a sharding wrapper (FSDP1's ``FullyShardedDataParallel``,
    whose flat parameters are shards) and none that DeepSpeed ZeRO partitions (``ds_id``).
    Named, not imported: neither package need be installed. None: ``module`` is no torch
    module (a DeepSpeed engine, a compiled model and a Lightning module are)."""
    if not isinstance(module, torch.nn.Module):
        return None

    def parameters() -> list[torch.Tensor]:
        if any(type(m).__name__ in SHARDING_WRAPPERS for m in module.modules()):
            return []
        return [p for p in module.parameters() if not hasattr(p, "ds_id")]

    return parameters


def replica_splits(fingerprints: Sequence[int], mp_size: int) -> list[schemas.ReplicaSplit]:
    """The slots whose replicas disagree (``fingerprints[rank]``), each split into groups of
    ranks holding one fingerprint, largest group first (ties: lowest rank first)."""
    splits = []
    for slot in range(mp_size):
        groups: dict[int, list[int]] = {}
        for rank in range(slot, len(fingerprints), mp_size):
            groups.setdefault(fingerprints[rank], []).append(rank)
        if len(groups) > 1:
            ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))
            splits.append(schemas.ReplicaSplit(slot=slot, groups=ordered))
    return splits


@dataclass(frozen=True, slots=True)
class WindowReading:
    """A window's figures, reduced over every rank."""

    steps: int
    loss_mean: float
    loss_max: float
    grad_norm_mean: float
    grad_norm_max: float
    nonfinite_steps: int
    fingerprint: int | None  # the agreed one; None: none taken, or replicas disagreed
    splits: list[schemas.ReplicaSplit]


class NumericsMonitor:
    """Accumulates on the device, reads once a window, compares the replicas' fingerprints."""

    def __init__(
        self,
        *,
        read_every: int = 10,
        fingerprint_every: int = 100,
        mp_size: int = 1,
        publish: Callable[[schemas.Event], None] | None = None,
        job: str = "local",
        node: str = "local",
        inject: Injection | None = None,
        on_clean: Callable[[int], None] | None = None,
    ):
        if read_every < 1 or fingerprint_every < 1 or fingerprint_every % read_every:
            raise ValueError(
                f"fingerprint_every ({fingerprint_every}) must be a positive multiple of "
                f"read_every ({read_every})"
            )
        self.read_every = read_every
        self.fingerprint_every = fingerprint_every
        self.mp_size = mp_size
        #: where rank 0 sends each window's ``Numerics`` event
        self.publish = publish
        self.job, self.node = job, node
        self._acc: torch.Tensor | None = None
        #: steps observed in this window (fewer than ``read_every`` after a mid-window restore)
        self._observed = 0
        #: the newest loss read from the device (for a step report without a sync)
        self.last_loss = 0.0
        #: chaos: what injected numerical faults make of a step before it is observed
        self.inject = inject
        #: told of each fingerprint step known clean (every replica agreed, nothing suspect)
        self.on_clean = on_clean
        #: a window since the last restore was non-finite or split: nothing after is clean
        self._suspect = False

    def reset(self) -> None:
        """Forget the window begun so far and any suspicion (a restore goes back to another
        step: a rollback's is before the fault)."""
        self._acc, self._observed, self._suspect = None, 0, False

    def observe(
        self,
        step: int,
        loss: torch.Tensor | float,
        grad_norm: torch.Tensor | float | None = None,
        parameters: Callable[[], Iterable[torch.Tensor]] | None = None,
    ) -> WindowReading | None:
        """Add step ``step`` (after its optimizer step); at a window's end, reduce, read and
        return the window (``parameters``: what to fingerprint when one is due)."""
        if self.inject is not None:
            loss = self.inject(step, loss, parameters)
        loss_t = torch.as_tensor(loss).detach().to(torch.float64)
        device = loss_t.device
        gnorm_t = (
            torch.zeros((), dtype=torch.float64, device=device)
            if grad_norm is None
            else torch.as_tensor(grad_norm).detach().to(device=device, dtype=torch.float64)
        )
        if self._acc is None or self._acc.device != device:
            self._acc = _empty(device)
        self._observed += 1
        finite = torch.isfinite(loss_t) & torch.isfinite(gnorm_t)
        zero = torch.zeros((), dtype=torch.float64, device=device)
        low = torch.full((), -math.inf, dtype=torch.float64, device=device)
        ok = finite.to(torch.float64)
        self._acc[:_SUMS] += torch.stack(
            [ok, torch.where(finite, loss_t, zero), torch.where(finite, gnorm_t, zero), 1 - ok]
        )
        self._acc[_SUMS:] = torch.maximum(
            self._acc[_SUMS:], torch.stack([torch.where(finite, v, low) for v in (loss_t, gnorm_t)])
        )
        if step % self.read_every:
            return None
        due = parameters if step % self.fingerprint_every == 0 else None
        own, slots = None, self.mp_size
        if due is not None:
            held = list(due())
            hsdp = hsdp_slots(held, _world()) if self.mp_size == 1 else None
            slots = hsdp or self.mp_size
            own = fingerprint(held, sharded=hsdp is not None)
        reading = self._read(device, own, slots)
        self._acc, self._observed = _empty(device), 0
        if self.publish is not None and _rank() == 0:
            self.publish(self.event(step, reading, step if due is not None else -1))
        self._judge(step, reading)
        return reading

    def _judge(self, step: int, reading: WindowReading) -> None:
        """When the replicas agreed at ``step`` and nothing suspect came since the last
        restore, mark the step before this window known clean: the window's own steps may
        hold a loss spike, which only the supervisor judges (its rollback goes before the
        window, so the checkpoint kept for it must be older than the window). A non-finite
        window or a split ends the claims until the next restore."""
        if reading.nonfinite_steps or reading.splits:
            self._suspect = True
        elif reading.fingerprint is not None and not self._suspect and self.on_clean is not None:
            self.on_clean(step - reading.steps)

    def event(self, step: int, reading: WindowReading, fingerprint_step: int) -> schemas.Numerics:
        return schemas.Numerics(
            job=self.job,
            node=self.node,
            rank=_rank(),
            step=step,
            steps=reading.steps,
            loss_mean=reading.loss_mean,
            loss_max=reading.loss_max,
            grad_norm_mean=reading.grad_norm_mean,
            grad_norm_max=reading.grad_norm_max,
            nonfinite_steps=reading.nonfinite_steps,
            fingerprint_step=fingerprint_step,
            fingerprint=reading.fingerprint or 0,
            splits=reading.splits,
        )

    def _read(self, device: torch.device, own: torch.Tensor | None, slots: int) -> WindowReading:
        world, rank = _world(), _rank()
        assert self._acc is not None
        sums = self._acc[:_SUMS].clone()
        maxima = [self._acc[_SUMS:]]
        if own is not None:  # this rank's slot holds (fp, -fp); every other slot -inf
            value = own.to(device=device, dtype=torch.float64)
            extremes = torch.full((2, slots), -math.inf, dtype=torch.float64, device=device)
            extremes[0, rank % slots] = value
            extremes[1, rank % slots] = -value
            maxima.append(extremes.reshape(-1))
        peak = torch.cat(maxima)
        if world > 1:
            target = collective_device()
            sums, peak = sums.to(target), peak.to(target)
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        count, loss_sum, gnorm_sum, nonfinite = sums.tolist()  # the window's one host read
        figures = peak.tolist()
        loss_max, gnorm_max = figures[0], figures[1]
        agreed: int | None = None
        splits: list[schemas.ReplicaSplit] = []
        if own is not None:
            high, negated_low = figures[2 : 2 + slots], figures[2 + slots :]
            if all(h == -n for h, n in zip(high, negated_low, strict=True)):
                agreed = int(high[0]) if slots == 1 else _combine(high)
            else:
                splits = replica_splits(_gather(own, world), slots)
        self.last_loss = loss_sum / count if count else self.last_loss
        return WindowReading(
            steps=self._observed,
            loss_mean=loss_sum / count if count else 0.0,
            loss_max=loss_max if count else 0.0,
            grad_norm_mean=gnorm_sum / count if count else 0.0,
            grad_norm_max=gnorm_max if count else 0.0,
            nonfinite_steps=round(nonfinite),
            fingerprint=agreed,
            splits=splits,
        )


def _empty(device: torch.device) -> torch.Tensor:
    acc = torch.zeros(6, dtype=torch.float64, device=device)
    acc[_SUMS:] = -math.inf
    return acc


def _combine(per_slot: list[float]) -> int:
    """One fingerprint for the whole model from its slots' (each replica set agreed)."""
    return sum(int(v) for v in per_slot) % FINGERPRINT_MODULUS


def _gather(own: torch.Tensor, world: int) -> list[int]:
    """Every rank's fingerprint (the rare path: some replicas disagreed)."""
    if world == 1:
        return [int(own.item())]
    value = own.to(device=collective_device(), dtype=torch.float64).reshape(1)
    out = [torch.empty_like(value) for _ in range(world)]
    dist.all_gather(out, value)
    return [int(v.item()) for v in out]


def _world() -> int:
    return dist.get_world_size() if grouped() else 1


def _rank() -> int:
    return dist.get_rank() if grouped() else 0
