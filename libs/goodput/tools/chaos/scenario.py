"""Chaos scenarios: a TOML schedule of faults, timed or Poisson, checked before anything fires.

```toml
duration_s = 300           # wall seconds the scenario runs
seed = 7                   # the same seed gives the same schedule and the same random targets
time_compression = 1440    # rate_per_day counts compressed days: 1440 → a day lasts a minute

[[faults]]
kind = "kill-rank"
at_s = 30                  # once, 30 s in
rank = 1

[[faults]]
kind = "fail-node"
rate_per_day = 5           # a Poisson process: 5 per (compressed) day, random node
clear_after_s = 20         # the node comes back 20 s later
```

``at_s`` and ``duration_s`` are wall seconds; ``rate_per_day`` is per day of scenario time,
which runs ``time_compression`` times faster than the wall clock, so "five interruptions a
day" can be lived through in minutes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeAlias, Union

import msgspec

from goodput import schemas
from goodput.tools.chaos import spec as faults
from goodput.tools.chaos.actions import FaultOutcome, fire
from goodput.tools.chaos.targets import ChaosContext

DAY_S = 86_400.0

if TYPE_CHECKING:
    # a Union built from a tuple is no type a checker can read: to it, any fault is a
    # FaultSpec (the scenario fields they all share); msgspec decodes the tagged union
    FaultUnion: TypeAlias = faults.FaultSpec
else:
    FaultUnion = Union[faults.FAULT_TYPES]  # noqa: UP007


#: at most this many entries in a file, and this many firings planned for one Poisson entry
MAX_FAULTS = 1000
MAX_PLANNED = 10_000


class Scenario(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    duration_s: faults.Positive
    faults: Annotated[list[FaultUnion], msgspec.Meta(min_length=1, max_length=MAX_FAULTS)]
    seed: int = 0
    time_compression: Annotated[float, msgspec.Meta(gt=0, le=1e6)] = 1.0


class ScenarioError(ValueError):
    """A scenario file that cannot run, with the reason (checked before any fault fires)."""


def parse_scenario(text: str, source: str = "scenario") -> Scenario:
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from exc
    _check_kinds(data, source)
    try:
        scenario = msgspec.convert(data, Scenario)
    except msgspec.ValidationError as exc:
        raise ScenarioError(f"{source}: {exc}") from exc
    _check_timing(scenario, source)
    return scenario


def load_scenario(path: Path) -> Scenario:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    return parse_scenario(text, str(path))


def _check_kinds(data: dict, source: str) -> None:
    """Name an unknown fault plainly (msgspec would only say 'Invalid value')."""
    entries = data.get("faults")
    if not isinstance(entries, list):
        return  # msgspec reports the missing or mistyped list
    known = ", ".join(faults.FAULTS_BY_KIND)
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        if "kind" not in entry:
            raise ScenarioError(f"{source}: faults[{index}] has no kind (one of: {known})")
        if not isinstance(entry["kind"], str):
            raise ScenarioError(
                f"{source}: faults[{index}].kind must be a string (one of: {known})"
            )
        if entry["kind"] not in faults.FAULTS_BY_KIND:
            raise ScenarioError(
                f"{source}: faults[{index}]: unknown fault {entry['kind']!r} (known: {known})"
            )


def _check_timing(scenario: Scenario, source: str) -> None:
    for index, fault in enumerate(scenario.faults):
        where = f"{source}: faults[{index}] ({fault.kind})"
        if (fault.at_s is None) == (fault.rate_per_day is None):
            raise ScenarioError(
                f"{where}: give exactly one of at_s (once) or rate_per_day (Poisson)"
            )
        if fault.at_s is not None and fault.at_s > scenario.duration_s:
            raise ScenarioError(
                f"{where}: at_s = {fault.at_s:g} is after the end (duration_s = {scenario.duration_s:g})"
            )
        if fault.rate_per_day is not None:
            expected = fault.rate_per_day * scenario.time_compression * scenario.duration_s / DAY_S
            if expected > MAX_PLANNED:
                raise ScenarioError(
                    f"{where}: rate_per_day × time_compression × duration_s plans about "
                    f"{expected:.3g} faults; at most {MAX_PLANNED} per entry"
                )
        if fault.clear_after_s is not None:
            if not isinstance(fault, faults.CLEARABLE):
                clearable = ", ".join(schemas.kind_of(t) for t in faults.CLEARABLE)
                raise ScenarioError(f"{where}: clear_after_s only applies to {clearable}")
            if getattr(fault, "clear", False):
                raise ScenarioError(f"{where}: clear_after_s on a fault that is itself a clear")


@dataclass(frozen=True, order=True)
class PlannedFault:
    at_s: float
    #: tie-breaker keeping the file's order for simultaneous faults
    order: int
    fault: faults.FaultSpec = field(compare=False)
    #: this entry undoes an earlier fault
    is_clear: bool = field(default=False, compare=False)


def plan(scenario: Scenario) -> list[PlannedFault]:
    """Every fault's firing time (wall seconds from the start), deterministic for a seed.

    Each Poisson entry draws from its own generator (seeded by the scenario seed and the
    entry's position), so editing one entry does not move the others.
    """
    planned = []
    counter = itertools.count()
    for index, fault in enumerate(scenario.faults):
        if fault.at_s is not None:
            planned.append(PlannedFault(fault.at_s, next(counter), fault))
            continue
        assert fault.rate_per_day is not None
        rate_per_s = fault.rate_per_day * scenario.time_compression / DAY_S
        rng = random.Random(f"{scenario.seed}/{index}")
        t = rng.expovariate(rate_per_s)
        while t < scenario.duration_s:
            planned.append(PlannedFault(round(t, 6), next(counter), fault))
            t += rng.expovariate(rate_per_s)
    return sorted(planned)


@dataclass
class Fired:
    at_s: float
    planned_s: float
    outcome: FaultOutcome
    is_clear: bool

    def as_dict(self) -> dict:
        return {
            "t_s": round(self.at_s, 3),
            "planned_s": round(self.planned_s, 3),
            "clear": self.is_clear,
            **self.outcome.as_dict(),
        }


async def run_scenario(
    scenario: Scenario, ctx: ChaosContext, report: Callable[[Fired], None]
) -> list[Fired]:
    """Fire the plan in real time; a slow-rank runs alongside what follows it.

    A fault that fails (its target is gone, say) is reported and the scenario goes on.
    Faults with ``clear_after_s`` are undone on time, and at the latest when the scenario ends.
    """
    queue = plan(scenario)
    heapq.heapify(queue)
    order = itertools.count(len(queue))
    start = time.monotonic()
    fired: list[Fired] = []
    background: set[asyncio.Task[None]] = set()

    def record(planned: PlannedFault, outcome: FaultOutcome) -> None:
        entry = Fired(time.monotonic() - start, planned.at_s, outcome, planned.is_clear)
        fired.append(entry)
        report(entry)

    async def run_in_background(planned: PlannedFault) -> None:
        record(planned, await fire(planned.fault, ctx))

    while queue:
        planned = heapq.heappop(queue)
        await asyncio.sleep(max(start + planned.at_s - time.monotonic(), 0))
        if isinstance(planned.fault, faults.SlowRank):
            task = asyncio.create_task(run_in_background(planned))
            background.add(task)
            task.add_done_callback(background.discard)
            continue
        outcome = await fire(planned.fault, ctx)
        record(planned, outcome)
        clear_after = planned.fault.clear_after_s
        if outcome.ok and clear_after is not None and not planned.is_clear:
            undo = msgspec.structs.replace(outcome.applied, clear=True, clear_after_s=None)
            at_s = min(planned.at_s + clear_after, scenario.duration_s)
            heapq.heappush(queue, PlannedFault(at_s, next(order), undo, is_clear=True))
    remaining = start + scenario.duration_s - time.monotonic()
    if background:
        _, pending = await asyncio.wait(background, timeout=max(remaining, 0))
        for task in pending:
            task.cancel()  # the duty cycle resumes its target as it stops
        await asyncio.gather(*pending, return_exceptions=True)
    else:
        await asyncio.sleep(max(remaining, 0))
    return fired
