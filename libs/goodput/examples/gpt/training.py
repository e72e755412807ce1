"""Model, optimizer, LR schedule and one DDP training step; the full, resumable training state.

Numerics, stated once:
- The gradient of a step is the mean over all micro-batches of the global batch, whatever the
  world size: each rank scales its micro-batch losses by 1/(micro-batches per rank) and DDP
  averages over ranks. Samples, micro-batch boundaries and dropout masks depend only on
  ``(seed, step, micro-batch index)``, never on rank or world size.
- Same world size: bit-identical across restarts (the same float operations in the same order).
- Different world size: the same math, rounded differently (accumulation order, all-reduce order,
  1/m and 1/W scalings), so results are numerically close, not bit-identical.

What changes at a different data-parallel size (the batch plan, the LR) is decided by the
rescale callbacks of ``goodput.shim.rescale`` when the checkpoint is restored, before the
trainer loads it; the trainer only adopts the plan it is given.
"""

import gc
import hashlib
import math
import random
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from goodput.examples.gpt.data import BatchSampler, dropout_seed, make_corpus, split_micro_batches
from goodput.examples.gpt.model import GPT, ModelConfig
from goodput.shim.rescale import BatchPlan

#: 2: the batch plan and world size moved to the checkpoint's metadata (goodput.shim)
STATE_FORMAT = 2


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    total_steps: int = 300  # length of the LR schedule
    #: 12 samples per step over every rank, one per forward/backward; peak LR 3e-3
    plan: BatchPlan = field(default_factory=lambda: BatchPlan(global_batch=12, lr=3e-3))
    model: ModelConfig = field(default_factory=ModelConfig)
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    corpus_chars: int = 200_000


class WarmupCosine:
    """LR multiplier: linear warmup, then cosine decay to ``min_ratio`` at ``total_steps``.

    A class rather than a closure so LambdaLR saves its fields in the scheduler state.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_ratio = min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def params_sha256(model: nn.Module) -> str:
    """SHA-256 over the names and raw bytes of all parameters, in name order."""
    if isinstance(model, DistributedDataParallel):
        model = model.module
    digest = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(parameter.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def capture_rng_states() -> dict[str, Any]:
    """torch, python and numpy global RNG states, as plain types that torch.load(weights_only) reads."""
    numpy_state = np.random.get_state(legacy=False)
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    numpy_state = states["numpy"]
    np.random.set_state(
        {
            "bit_generator": numpy_state["bit_generator"],
            "state": {
                "key": numpy_state["key"].numpy().astype(np.uint32),
                "pos": numpy_state["pos"],
            },
            "has_gauss": numpy_state["has_gauss"],
            "gauss": numpy_state["gauss"],
        }
    )


class ComputeClock:
    """When this rank's gradients were last ready to send: the end of its own compute.

    In synchronous data parallelism every rank's step takes as long as the slowest one, so a
    step's wall time cannot tell who is slow; the time until the gradients are ready can.
    """

    def __init__(self) -> None:
        self.ready_s = 0.0


def rank_ordered_mean_hook(
    state: ComputeClock | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: gather every rank's gradients and sum them in rank order.

    A ring all-reduce adds each element in an order set by its position in the bucket, and DDP
    re-buckets parameters after its first step, so a resumed run would round differently from an
    uninterrupted one at world size 3 and more. Summing gathered copies rank by rank gives the
    same bits whatever the bucket layout (at W times the traffic, nothing at this model size).
    """
    if state is not None:
        state.ready_s = time.perf_counter()
    world_size = dist.get_world_size()
    flat = bucket.buffer()
    # beside the bucket: a group's backend serves the gradients' device (CUDA under NCCL)
    gathered = torch.empty((world_size, flat.numel()), dtype=flat.dtype, device=flat.device)
    work = dist.all_gather_single(gathered, flat.view(1, -1), async_op=True)

    def rank_ordered_mean(_: torch.futures.Future[object]) -> torch.Tensor:
        total = gathered[0].clone()
        for part in gathered[1:]:
            total += part
        return total.div_(world_size).view_as(flat)

    return work.get_future().then(rank_ordered_mean)


class Trainer:
    """One data-parallel rank of the job: owns the model, optimizer, schedule, data and step.

    The global RNGs are seeded identically on every rank and the training step draws its
    randomness from a forked generator seeded per micro-batch, so the global RNG states are the
    same on all ranks and the copy saved by any rank restores every rank.
    """

    def __init__(self, config: TrainConfig, rank: int = 0, world_size: int = 1) -> None:
        if world_size > 1 and not dist.is_initialized():
            raise RuntimeError("world_size > 1 needs torch.distributed initialised first")
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.plan = config.plan
        split_micro_batches(self.plan.global_batch, self.plan.micro_batch, world_size)
        self.step = 0

        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.model = GPT(config.model)
        self.ddp: DistributedDataParallel | None = None
        self.clock = ComputeClock()
        #: seconds this rank computed in the last step, excluding waits for its peers
        self.last_compute_time_s = 0.0
        #: of which an injected delay (``slowdown``): what the next delay must not grow from
        self._last_delay_s = 0.0
        #: the last step's gradient norm before clipping (None: not clipped), for the numerics
        self.last_grad_norm: torch.Tensor | None = None
        self.regroup()
        self.optimizer = torch.optim.AdamW(
            self._param_groups(), lr=config.plan.lr, betas=config.betas
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            WarmupCosine(config.warmup_steps, config.total_steps, config.min_lr_ratio),
        )
        self.sampler = BatchSampler(
            make_corpus(config.seed, config.corpus_chars), config.model.seq_len, config.seed
        )

    def _param_groups(self) -> list[dict[str, Any]]:
        # Weight decay on matrices only; biases, LayerNorm and position tables are not decayed.
        decayed = [p for n, p in self.model.named_parameters() if p.dim() >= 2 and "pos" not in n]
        plain = [p for n, p in self.model.named_parameters() if p.dim() < 2 or "pos" in n]
        return [
            {"params": decayed, "weight_decay": self.config.weight_decay},
            {"params": plain, "weight_decay": 0.0},
        ]

    @property
    def tokens_per_step(self) -> int:
        return self.plan.global_batch * self.config.model.seq_len

    def train_step(self, slowdown: float = 1.0) -> float:
        """Forward/backward over this rank's micro-batches, all-reduce, optimizer step.

        Returns the mean loss over the whole global batch (the same number on every rank).
        ``slowdown`` > 1 stretches this rank's compute to that many times its last undelayed
        compute time (a wait inside the compute, as a host waits on a throttled device), so its
        peers wait for it in the all-reduce: an injected straggler exactly that much slower.
        """
        started = time.perf_counter()
        delay_s = (slowdown - 1) * (self.last_compute_time_s - self._last_delay_s)
        if delay_s > 0:
            time.sleep(delay_s)
        self._last_delay_s = max(delay_s, 0.0)
        self.model.train()
        micro_batches = self.sampler.rank_micro_batches(
            self.step, self.plan.global_batch, self.plan.micro_batch, self.rank, self.world_size
        )
        network = self.ddp or self.model
        loss_sum = torch.zeros(())
        for position, micro_batch in enumerate(micro_batches):
            is_last = position == len(micro_batches) - 1
            # Only the last backward of the step all-reduces; the others accumulate locally.
            sync = nullcontext() if self.ddp is None or is_last else self.ddp.no_sync()
            with sync, torch.random.fork_rng(devices=[]):
                torch.manual_seed(dropout_seed(self.config.seed, self.step, micro_batch.index))
                _, loss = network(micro_batch.inputs, micro_batch.targets)
                (loss / len(micro_batches)).backward()
            loss_sum += loss.detach()
        synced = time.perf_counter()
        if self.config.grad_clip > 0:
            self.last_grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), self.config.grad_clip
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        gradients_ready = self.clock.ready_s if self.ddp is not None else synced
        self.last_compute_time_s = (gradients_ready - started) + (time.perf_counter() - synced)
        if self.world_size > 1:
            dist.all_reduce(loss_sum)
        return loss_sum.item() / (self.plan.global_batch // self.plan.micro_batch)

    def skip_step(self) -> None:
        """Count the next step done without training on its batch (a loss spike's window):
        the data position moves past it; the weights, the optimizer and the LR schedule do not
        (a batch's samples are a function of its step, so nothing else needs to be consumed)."""
        self.step += 1

    def regroup(self) -> None:
        """Wrap the model for the current default process group (at start, after an
        in-process restart joined a fresh one, and once a trainer built before any group — a
        standby's — joins one: it takes the group's rank and size)."""
        if dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            split_micro_batches(self.plan.global_batch, self.plan.micro_batch, self.world_size)
        if self.world_size > 1:
            self.ddp = DistributedDataParallel(self.model)
            self.ddp.register_comm_hook(self.clock, rank_ordered_mean_hook)

    def release_group(self) -> None:
        """Before the process group is aborted mid-step: drop the DDP wrapper that holds it
        and the gradients the abandoned step half accumulated (the restore sets the rest)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.close()

    def close(self) -> None:
        """Drop the DDP wrapper before the process group is destroyed (no training after this).

        Its reducer holds the gloo group; left to interpreter exit, the group's destructor can
        join gloo threads that wait for the GIL it holds, and the process hangs.
        """
        self.ddp = None
        gc.collect()

    def state_dict(self) -> dict[str, Any]:
        """The full training state. Tensors are live references: snapshot before mutating."""
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "model_config": asdict(self.config.model),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": capture_rng_states(),
            "data": {"seed": self.config.seed, "step": self.step},
        }

    def load_state_dict(self, state: dict[str, Any], plan: BatchPlan | None = None) -> None:
        """Restore a state saved at any world size, with the batch plan in force from now on
        (the rescale callbacks adjusted ``state``'s optimizer and scheduler to it already)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unsupported training state format {state.get('format')!r}")
        if state["model_config"] != asdict(self.config.model):
            raise ValueError(
                f"checkpoint model {state['model_config']} differs from {asdict(self.config.model)}"
            )
        if state["data"]["seed"] != self.config.seed:
            raise ValueError(f"checkpoint data seed {state['data']['seed']} != {self.config.seed}")
        plan = plan or self.plan
        split_micro_batches(plan.global_batch, plan.micro_batch, self.world_size)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_states(state["rng"])
        self.step = state["data"]["step"]
        self.plan = plan
