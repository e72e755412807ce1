"""Numerical faults from the trainer's ``Numerics`` windows (``shim/numerics.py``): pure, the
clock passed in, every finding with its reason.

- **Non-finite**: a window with a NaN or infinite loss or gradient norm on any rank.
- **Loss spike**: a window's largest loss above the median of the last ``window`` healthy
  windows' largest losses by ``mad_factor`` × their scaled median absolute deviation
  (1.4826 × MAD estimates a normal spread; robust to the spikes themselves, which never
  join the history). The threshold is learned from the job's own losses, like the hang
  timeout from its own step times; ``min_rise`` of the median is the least rise that counts,
  for a loss so steady its MAD is about 0. Only a rise counts: a falling loss is training.
  Nothing is judged before ``min_windows`` windows were seen (warm-up). A job that went back
  (a window starting at or before a step already seen: a restart from a checkpoint) forgets
  the windows past that point: they belong to a timeline it abandoned, whose later, lower
  losses would make the earlier ones look like spikes (a spare restored from step 20 of a job
  at step 1,500 was once "rolled back" for its step-21 loss, in a crash loop).
- **Replica mismatch**: data-parallel replicas holding different parameters. The largest
  group of a slot, when a strict majority, is taken as right and the others as corrupt; with
  no majority (two replicas, or a three-way split) no replica can be named: one finding
  names none, and no node is counted an offender (a sound one would be quarantined next).
  A node whose rank disagreed before is a repeat offender: its finding is ``uncorrectable`` (its
  node is to be replaced), the first one ``correctable`` (a rollback cures a transient flip).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import msgspec

from goodput import schemas

#: a normal distribution's standard deviation is about this × its median absolute deviation
MAD_TO_SIGMA = 1.4826
#: agreed fingerprint steps remembered, so that a job that went back finds the one before
AGREED_KEPT = 64


class SpikeRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    #: healthy windows the median and MAD are taken over
    window: int = 50
    #: windows seen before any is judged (a loss falls fastest at first)
    min_windows: int = 10
    #: how many robust standard deviations above the median a spike is
    mad_factor: float = 8.0
    #: the least rise over the median that counts, as a share of the median: a window's
    #: largest loss has a heavy tail (a hard batch; in the seeded test's falling loss, 5 %
    #: noise and 1 % of batches 20 % harder, windows reach +30 % over the median in 10,000
    #: steps, three seeds), while a fault worth a rollback (a poisoned batch, a divergence)
    #: multiplies the loss
    min_rise: float = 0.5

    def __post_init__(self) -> None:
        if self.window < 3 or not 1 <= self.min_windows <= self.window:
            raise ValueError(f"need 3 <= window and 1 <= min_windows <= window: {self!r}")
        if not (self.mad_factor > 0 and self.min_rise >= 0):
            raise ValueError(f"mad_factor must be positive, min_rise not negative: {self!r}")


@dataclass(frozen=True, slots=True)
class Finding:
    kind: Literal["nonfinite", "loss_spike", "replica_mismatch"]
    #: the first step the fault may have touched (a rollback goes to a checkpoint before it)
    first_bad_step: int
    #: the window's last step, where it was seen
    step: int
    reason: str
    severity: Literal["correctable", "uncorrectable"] = "correctable"
    rank: int | None = None  # the suspect replica (replica mismatch)
    node: str = ""  # its node


class NumericsJudge:
    """One job's numerical-fault judge over its ``Numerics`` windows."""

    def __init__(self, rule: SpikeRule | None = None):
        self.rule = rule or SpikeRule()
        #: the healthy windows' (last step, largest loss), oldest first
        self._peaks: deque[tuple[int, float]] = deque(maxlen=self.rule.window)
        self._seen = 0
        #: nodes whose ranks were found disagreeing with their replicas so far
        self._offenders: set[str] = set()
        #: steps fingerprinted with every replica agreeing, oldest first
        self._agreed: deque[int] = deque(maxlen=AGREED_KEPT)

    @property
    def last_agreed_step(self) -> int:
        """The newest step fingerprinted with every replica agreeing (-1: none yet)."""
        return self._agreed[-1] if self._agreed else -1

    @property
    def judging_spikes(self) -> bool:
        """Whether the next window's loss is judged: the warm-up is behind, counted in the
        job's current timeline (a restart forgets the windows after its restore step)."""
        return self._seen >= self.rule.min_windows and len(self._peaks) >= self.rule.min_windows

    def observe(self, event: schemas.Numerics, nodes: Mapping[int, str]) -> list[Finding]:
        """The findings of one window (oldest first); ``nodes``: each rank's node."""
        findings: list[Finding] = []
        first = event.step - event.steps + 1
        self._go_back_to(first)
        if event.nonfinite_steps:
            findings.append(
                Finding(
                    kind="nonfinite",
                    first_bad_step=first,
                    step=event.step,
                    reason=f"{event.nonfinite_steps} of steps {first}-{event.step} had a NaN "
                    "or infinite loss or gradient norm",
                )
            )
        elif (spike := self._spike(event.step, event.loss_max)) is not None:
            findings.append(
                Finding(kind="loss_spike", first_bad_step=first, step=event.step, reason=spike)
            )
        if event.fingerprint_step >= 0:
            mismatch = self._mismatch(event, nodes)
            if not mismatch:
                self._agreed.append(event.fingerprint_step)
            findings += mismatch
        return findings

    def _go_back_to(self, first: int) -> None:
        """Forget what was seen from step ``first`` on: the job restarted before it."""
        while self._peaks and self._peaks[-1][0] >= first:
            self._peaks.pop()
            self._seen = len(self._peaks)  # the warm-up counts again from what is left
        while self._agreed and self._agreed[-1] >= first:
            self._agreed.pop()

    def _spike(self, step: int, peak: float) -> str | None:
        """Why ``peak`` (the window ending at ``step``) is a spike, or None (then it joins the
        history)."""
        self._seen += 1
        history = [loss for _, loss in self._peaks]
        if self._seen > self.rule.min_windows and len(history) >= self.rule.min_windows:
            median = statistics.median(history)
            mad = statistics.median(abs(v - median) for v in history)
            allowed = max(
                self.rule.mad_factor * MAD_TO_SIGMA * mad, self.rule.min_rise * abs(median)
            )
            if peak > median + allowed:
                return (
                    f"loss {peak:.4g} over the median {median:.4g} of the last {len(history)} "
                    f"windows by {peak - median:.3g}; allowed {allowed:.3g} "
                    f"({self.rule.mad_factor:g} x 1.4826 x MAD {mad:.3g}, at least "
                    f"{self.rule.min_rise:.0%} of the median)"
                )
        self._peaks.append((step, peak))
        return None

    def _mismatch(self, event: schemas.Numerics, nodes: Mapping[int, str]) -> list[Finding]:
        findings = []
        first = self.last_agreed_step + 1
        for split in event.splits:
            replicas = sum(len(group) for group in split.groups)
            where = f"model-parallel slot {split.slot} at step {event.fingerprint_step}"
            if len(split.groups[0]) * 2 <= replicas:
                # no majority (two replicas, a three-way split): no replica can be named, so
                # none is blamed nor counted against its node; the rollback is the remedy
                findings.append(
                    Finding(
                        kind="replica_mismatch",
                        first_bad_step=first,
                        step=event.fingerprint_step,
                        reason=f"{where}: no majority among replicas {split.groups}, none "
                        "can be named",
                    )
                )
                continue
            why = f"replicas {split.groups[0]} agree against {split.groups[1:]}"
            for rank in (r for g in split.groups[1:] for r in g):
                node = nodes.get(rank, "")
                repeat = bool(node) and node in self._offenders
                self._offenders.add(node)
                findings.append(
                    Finding(
                        kind="replica_mismatch",
                        first_bad_step=first,
                        step=event.fingerprint_step,
                        rank=rank,
                        node=node,
                        severity="uncorrectable" if repeat else "correctable",
                        reason=f"{where}: {why}"
                        + (f"; node {node} disagreed before (repeat offender)" if repeat else ""),
                    )
                )
        return findings
