"""Where the job's data stream stands, saved with every checkpoint so a resume continues on the
next unseen sample, mid-epoch, at the same or at another data-parallel size.

A framework that restarts a plain ``DataLoader`` starts its epoch again at batch 0: the
resumed steps train on samples already seen and the run is no longer the uninterrupted one.
:class:`ResumableSampler` fixes the order of an epoch over the whole job (one permutation of
the dataset, cut into global batches of the batch plan) and deals each global batch out to the
data-parallel ranks in contiguous slices; its position is the number of samples of the epoch
the job has trained on, counted globally. That position does not depend on the data-parallel
size, so after 2 -> 1 ranks under ``keep_global_batch`` the one rank trains on the same global
batches in the same order as the two did (the math of a step unchanged).

The integrations own the counting: they :meth:`~ResumableSampler.bind` the sampler to the
layout and plan in force after every restore and :meth:`~ResumableSampler.advance` it as the
job trains (the sampler cannot count on its own: a loader's workers prefetch ahead of the
training). A loader that keeps its own position (torchdata's ``StatefulDataLoader``) is saved
through its ``state_dict`` instead. Its state is per rank (each rank's sampler, its generator,
its shard of a stream), while a checkpoint holds one state for all of a node's ranks (the
engine splits it among them as identical, and a spare may resume from another node's copy):
so every rank's position is gathered over the default process group into the state each rank
saves, keyed by global rank, and each rank resumes from its own entry, at the same
data-parallel size only (see :func:`loader_state`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Sampler

from goodput.shim.collectives import all_gather_object, grouped
from goodput.shim.rescale import BatchPlan

if TYPE_CHECKING:
    from goodput.shim.trainer import TrainerShim


class DataPositionError(ValueError):
    """The data loader cannot resume where the job stands (one line for the user)."""


class ResumableSampler(Sampler[int]):
    """A sampler whose epoch and position are part of the checkpoint (global sample order)."""

    def __init__(self, length: int, *, shuffle: bool = True, seed: int = 0) -> None:
        if length < 1:
            raise ValueError(f"a dataset of {length} samples cannot be sampled")
        self.length = length
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        #: samples of ``epoch`` the job has trained on, over every data-parallel rank
        self.consumed = 0
        self._dp_rank = 0
        self._dp_size = 1
        self._global_batch: int | None = None

    def bind(self, *, dp_rank: int, dp_size: int, plan: BatchPlan) -> None:
        """The layout and batch plan in force (the integration calls it after each restore)."""
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"data-parallel rank {dp_rank} is not in 0..{dp_size - 1}")
        if plan.global_batch % dp_size:
            raise DataPositionError(
                f"global batch {plan.global_batch} does not split over {dp_size} data-parallel ranks"
            )
        if plan.global_batch > self.length:
            raise DataPositionError(
                f"global batch {plan.global_batch} is larger than the dataset ({self.length})"
            )
        self._dp_rank, self._dp_size, self._global_batch = dp_rank, dp_size, plan.global_batch

    @property
    def epoch_samples(self) -> int:
        """Samples of an epoch trained on: whole global batches (the rest is dropped)."""
        return self.length - self.length % self._bound_batch()

    def set_epoch(self, epoch: int) -> None:
        """Frameworks call this at each epoch's start; only a later epoch moves the position
        (a resumed framework repeats the epoch it stopped in, which must go on, not restart)."""
        if epoch > self.epoch:
            self.epoch, self.consumed = epoch, 0

    def advance(self, samples: int) -> None:
        """``samples`` more of the epoch trained on, over every data-parallel rank; a finished
        epoch rolls over to the next."""
        self.consumed += samples
        if self.consumed >= self.epoch_samples:
            self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.seed:
            raise DataPositionError(
                f"the checkpoint's sampler seed {state['seed']} is not this one's ({self.seed})"
            )
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])

    def __iter__(self) -> Iterator[int]:
        # the order is fixed when iteration starts: advance() during the epoch moves only the
        # position a later resume starts from, not the batches a prefetching loader draws
        return iter(self._remaining())

    def __len__(self) -> int:
        """This rank's share of a whole epoch (what frameworks count an epoch's batches by;
        an iteration started mid-epoch yields only the rest)."""
        return self.epoch_samples // self._dp_size

    def _remaining(self) -> list[int]:
        global_batch = self._bound_batch()
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=generator).tolist()
        else:
            order = list(range(self.length))
        share = global_batch // self._dp_size
        mine: list[int] = []
        for start in range(self.consumed, self.epoch_samples - global_batch + 1, global_batch):
            first = start + self._dp_rank * share
            mine.extend(order[first : first + share])
        return mine

    def _bound_batch(self) -> int:
        if self._global_batch is None:
            raise DataPositionError(
                "the ResumableSampler is not bound: give its loader to the goodput integration "
                "(data=loader)"
            )
        return self._global_batch


def resumable_sampler(loader: Any) -> ResumableSampler | None:
    """The loader's :class:`ResumableSampler` (as its sampler or its batch sampler's), or None."""
    for sampler in (
        getattr(loader, "sampler", None),
        getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    ):
        if isinstance(sampler, ResumableSampler):
            return sampler
    return None


def check_resumable(loader: Any) -> None:
    """Refuse, in one line, a loader that cannot resume mid-epoch."""
    if resumable_sampler(loader) is None and not _stateful(loader):
        raise DataPositionError(
            "the data loader cannot resume mid-epoch: give it a goodput ResumableSampler "
            "(sampler=ResumableSampler(len(dataset))) or use torchdata's StatefulDataLoader"
        )


def check_batch(loader: Any, plan: BatchPlan | None) -> BatchPlan:
    """Refuse, in one line, a loader that batches otherwise than the plan says
    (``micro_batch`` is what one rank runs per forward/backward)."""
    if plan is None:
        raise DataPositionError("a data loader needs the batch plan: pass plan=BatchPlan(...)")
    batch_size = getattr(loader, "batch_size", None)
    if batch_size is not None and batch_size != plan.micro_batch:
        raise DataPositionError(
            f"the loader's batch_size ({batch_size}) is not the batch plan's micro_batch "
            f"({plan.micro_batch})"
        )
    return plan


def loader_state(loader: Any, *, dp_size: int, rank: int = 0) -> dict[str, Any]:
    """The loader's position at ``dp_size`` data-parallel ranks, saved with the checkpoint.

    A stateful loader's is every rank's (a collective over the default process group when
    one is up: every rank calls this together, as every rank saves together), so that the
    state is the same on every rank of a node, which share one checkpoint."""
    sampler = resumable_sampler(loader)
    if sampler is not None:
        return {"sampler": sampler.state_dict()}
    own = loader.state_dict()
    positions = dict(enumerate(all_gather_object(own))) if grouped() else {rank: own}
    return {"loaders": positions, "dp_size": dp_size}


def load_loader_state(loader: Any, state: dict[str, Any], *, dp_size: int, rank: int = 0) -> None:
    """Put ``loader`` back where ``state`` (a :func:`loader_state`) says, at ``dp_size``
    ranks; a stateful loader where global rank ``rank`` stood."""
    sampler = resumable_sampler(loader)
    if sampler is not None:
        sampler.load_state_dict(state["sampler"])
        return
    if "loaders" not in state:
        raise DataPositionError("the checkpoint holds a sampler position, the loader is stateful")
    if state["dp_size"] != dp_size:
        raise DataPositionError(
            f"a StatefulDataLoader's position is per rank: it cannot move from "
            f"{state['dp_size']} to {dp_size} data-parallel ranks (use a ResumableSampler)"
        )
    if rank not in state["loaders"]:
        raise DataPositionError(
            f"the checkpoint holds no data position of rank {rank} (it has ranks "
            f"{sorted(state['loaders'])}): its positions were saved without a process group"
        )
    loader.load_state_dict(state["loaders"][rank])


def _stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


class LoaderPosition:
    """One rank's data loader as the integrations drive it: checked against the plan, bound
    to the layout after each restore, advanced as the job trains, saved and restored."""

    def __init__(self, loader: Any) -> None:
        check_resumable(loader)
        self.loader = loader
        self._dp_size = 1
        self._rank = 0
        self._ranks_per_node = 1

    def bind(self, shim: TrainerShim, plan: BatchPlan | None) -> None:
        """After a restore (or a fresh start): the plan and layout in force from now on.
        The model-parallel ranks of one replica are consecutive (rank // model-parallel size
        is the data-parallel rank), as torchrun-launched DP x TP meshes lay them out."""
        plan = check_batch(self.loader, plan)
        self._dp_size = shim.layout.dp_size
        self._rank = shim.config.rank
        self._ranks_per_node = shim.config.local_world_size
        sampler = resumable_sampler(self.loader)
        if sampler is not None:
            dp_rank = shim.config.rank // shim.config.model_parallel_size
            sampler.bind(dp_rank=dp_rank, dp_size=self._dp_size, plan=plan)

    def state(self) -> dict[str, Any]:
        """The position to save (every rank calls it together: see :func:`loader_state`).
        Checked here, not at ``bind``: Lightning forms its process group after the restore."""
        if resumable_sampler(self.loader) is None and self._ranks_per_node > 1 and not grouped():
            raise DataPositionError(
                f"a StatefulDataLoader on {self._ranks_per_node} ranks per node needs the "
                "default process group (init_process_group before the loop): the ranks' "
                "positions are gathered into the checkpoint they share"
            )
        return loader_state(self.loader, dp_size=self._dp_size, rank=self._rank)

    def load(self, state: dict[str, Any]) -> None:
        load_loader_state(self.loader, state, dp_size=self._dp_size, rank=self._rank)

    def advance(self, samples: int) -> None:
        """``samples`` trained on over every data-parallel rank (a stateful loader counts its
        own batches)."""
        sampler = resumable_sampler(self.loader)
        if sampler is not None:
            sampler.advance(samples)
