"""The strategies compared on one failure trace: each a named combination of techniques.

Cumulative, as the case study adds them: ``baseline`` (synchronous save to the object store
at a fixed interval, the whole job restarted on any fault, no spares, stragglers ignored),
then ``+async``, ``+multi-tier``, ``+hot-swap``, ``+scale-down/up``, ``+interval-tuning``,
and ``goodput`` (everything: the built-in policy, which also weighs evicting stragglers, and a
ready standby for every rank: a launch whose nodes' standbys are ready starts warm). The policy
of each is a real policy script (or the built-in policy) run by the real controller.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from goodput.schemas.tiers import OBJECT_STORE, StorageTier
from goodput.tools.simulate.profile import SimulateError


@dataclass(frozen=True)
class Strategy:
    name: str
    asynchronous: bool
    multi_tier: bool
    spares: bool
    interval_tuning: bool
    #: a policy script's path, or None for the built-in policy
    policy: str | None
    #: keep a ready standby for every rank of every node, spares included
    #: (``StartJob.standbys`` = ranks per node), so a launch on ready nodes is warm
    standbys: bool = False
    #: where a single-tier strategy's checkpoints go: the object store (a fleet job's), or
    #: the node's own disk (``goodput demo``'s baseline ``torch.save``s to a local directory)
    single_tier: StorageTier = OBJECT_STORE


def _policy(package: str, name: str) -> str:
    return str(Path(str(resources.files(package) / name)))


def strategies(user_policy: str | None = None) -> dict[str, Strategy]:
    """Every strategy by name; ``user_policy`` replaces the built-in policy of ``goodput``."""
    baseline = _policy("goodput.supervisor.policy.scripts", "restart_whole_job.py")
    hot_swap = _policy("goodput.tools.simulate.policies", "hot_swap_only.py")
    elastic = _policy("goodput.tools.simulate.policies", "tolerate_stragglers.py")
    return {
        s.name: s
        for s in (
            Strategy("baseline", False, False, False, False, baseline),
            Strategy("+async", True, False, False, False, baseline),
            Strategy("+multi-tier", True, True, False, False, baseline),
            Strategy("+hot-swap", True, True, True, False, hot_swap),
            Strategy("+scale-down/up", True, True, True, False, elastic),
            Strategy("+interval-tuning", True, True, True, True, elastic),
            Strategy("goodput", True, True, True, True, user_policy, standbys=True),
        )
    }


def pick(names: list[str] | None, user_policy: str | None = None) -> list[Strategy]:
    known = strategies(user_policy)
    if not names:
        return list(known.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SimulateError(
            f"unknown strategy {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
        )
    return [known[n] for n in names]
