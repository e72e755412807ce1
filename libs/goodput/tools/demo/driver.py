"""Injects a scenario's faults into the running demo job, through the chaos tool.

Faults reach the job the way ``goodput chaos`` sends them (``goodput.tools.chaos.actions``), so the
demo exercises the same paths a user's chaos test does (an SDC is ``goodput chaos sdc`` on the
node of the fault's rank). Node repairs run alongside the
scenario, each when its fault says it is due (``DemoFault.repair_due``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from goodput.tools.chaos import spec as faults
from goodput.tools.chaos.actions import fire
from goodput.tools.chaos.targets import ChaosContext, ChaosError
from goodput.tools.demo.scenarios import DemoFault, DemoScenario
from goodput.tools.stack.watch import JobWatcher

#: how long a node fault looks for the node's ranks before it is recorded as not applied
RANKS_WAIT_S = 15.0
#: how often the driver looks at the job while it waits for a fault's moment
POLL_S = 0.1
#: how many times a fault looks for its rank, each after the job stepped again, before it is
#: recorded as not applied (a relaunch can take every rank away just as the fault's step comes)
RANK_LOOKUPS = 3
#: a slow-rank's bound: the driver ends it once its steps are played (``Driver._slow``)
SLOW_CAP_S = 3600.0


@dataclass
class Injected:
    step: int
    fault: DemoFault
    node: str
    ok: bool
    detail: str
    repaired_at_step: int | None = None
    #: when it was fired (epoch ns, the clock of the events' ``ts``)
    at_ns: int = 0

    def as_dict(self) -> dict:
        return {
            "step": self.step,
            "fault": self.fault.action,
            "rank": self.fault.rank,
            "node": self.node,
            "ok": self.ok,
            "what": self.detail,
            "repaired_at_step": self.repaired_at_step,
        }


@dataclass
class Verdict:
    """When the sensor flagged an injected straggler (monotonic s), or the slowing ended
    unflagged; None while neither: the scenario's next fault waits for it."""

    at: float | None = None


@dataclass
class Driver:
    """Fires each fault at its step, once the job runs again after the previous one."""

    ctx: ChaosContext
    watcher: JobWatcher
    scenario: DemoScenario
    steps: int
    say: Callable[[str], None] = lambda _: None
    #: the job cannot train without a failed node (the baseline): repairs follow the wall clock
    job_waits_for_nodes: bool = False
    #: the job compares its replicas' fingerprints, so an SDC ends in a rollback; False (the
    #: baseline): it trains on with the corrupted replica, and the next fault need not wait
    compares_replicas: bool = True
    injected: list[Injected] = field(default_factory=list)
    _background: set[asyncio.Task] = field(default_factory=set)

    async def run(self) -> None:
        settled = self._job_stepping_since(0.0, attempt_after=0)
        fired = 0
        try:
            for fault in self.scenario.faults:
                if not await self._wait(functools.partial(self._due, fault, settled)):
                    return
                settled = await self._inject(fault)
                fired += 1
            await self._wait(lambda: not self._background)  # repairs still to come
        finally:
            # a fault whose moment never came is a failed fault of the scenario, said so
            for fault in self.scenario.faults[fired:]:
                self._record(fault, "", False, self._why_not_fired(fault))
            for task in self._background:
                task.cancel()
            await asyncio.gather(*self._background, return_exceptions=True)

    def _why_not_fired(self, fault: DemoFault) -> str:
        w = self.watcher
        return (
            f"not fired: due at step {int(fault.at * self.steps)}, the job "
            f"{'ended' if w.ended.is_set() else 'was still'} {w.state} at step {w.step}"
        )

    def _reached(self, fault: DemoFault) -> bool:
        return self.watcher.step >= fault.at * self.steps

    def _due(self, fault: DemoFault, settled: Callable[[], bool]) -> bool:
        """``fault`` may fire: the job settled since the last one and reached its step."""
        return settled() and self._reached(fault)

    def _job_stepping_since(self, since: float, attempt_after: int) -> Callable[[], bool]:
        """The job runs and steps in an attempt newer than ``attempt_after``, after ``since``."""

        def check() -> bool:
            w = self.watcher
            return (
                w.last_status is not None
                and w.last_status.state == "running"
                and w.attempt > attempt_after
                and w.last_step_at > max(since, w.attempt_started_at)
            )

        return check

    async def _wait(self, ready: Callable[[], bool]) -> bool:
        while not ready():
            if self.watcher.ended.is_set():
                return False
            await asyncio.sleep(POLL_S)
        return True

    async def _inject(self, fault: DemoFault) -> Callable[[], bool]:
        """Fire ``fault``; returns when the job will have played it out."""
        node = await self._node_of(fault)
        if node is None:
            return self._job_stepping_since(time.monotonic(), attempt_after=0)
        attempt = self.watcher.attempt
        match fault.action:
            case "slow-rank":
                entry = self._record(fault, node, True, fault.describe().split(", ", 1)[1])
                # it runs alongside what follows, but the next fault waits for the sensor's
                # verdict: at the full scenario's 400 steps the next fault is 64 steps on, and
                # at a quiet machine's 0.45 s slowed steps those 29 s were sometimes under
                # the 11 slowed steps and 20 s hold the sensor needs to flag it (CI: a node
                # loss's hot swap replaced the straggler unflagged, and no eviction was seen)
                verdict = Verdict()
                self._in_background(self._slow(fault, entry, verdict))
                return lambda: (
                    verdict.at is not None
                    and self._job_stepping_since(verdict.at, attempt_after=0)()
                )
            case "terminate-node":
                pids = await self._rank_pids(node)
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                ok = self._record(
                    fault,
                    node,
                    bool(pids),
                    f"SIGTERM to every rank of {node} (pids {pids})"
                    if pids
                    else f"no live rank of {node} found to terminate",
                ).ok
            case "sdc":
                outcome = await fire(_chaos_spec(fault, node), self.ctx)
                detail = outcome.detail
                if outcome.ok and not self.compares_replicas:
                    detail += "; the job compares no replicas: it trains on with the corrupted one"
                ok = self._record(fault, node, outcome.ok, detail).ok
                if not self.compares_replicas:  # no rollback to wait for
                    return self._job_stepping_since(time.monotonic(), attempt_after=0)
            case "fail-node" | "kill-rank" | "hang-rank":
                outcome = await fire(_chaos_spec(fault, node), self.ctx)
                ok = self._record(fault, node, outcome.ok, outcome.detail).ok
                if ok and fault.action == "fail-node" and fault.repair_after_s:
                    self._in_background(self._repair(node, fault))
        # a fault that took effect ends in a new attempt; one that did not leaves the job as is
        return self._job_stepping_since(time.monotonic(), attempt_after=attempt if ok else 0)

    async def _slow(self, fault: DemoFault, entry: Injected, verdict: Verdict) -> None:
        """Slow the rank for ``fault.duration_s`` and ``fault.min_slow_steps`` training steps,
        or until it is replaced; ``entry`` then records how long it really was slow, and
        ``verdict`` when the sensor flagged it (or, unflagged, when the slowing ended).

        Counted in steps because the detector judges a straggler over steps: a period set in
        seconds from the pace before it fired came out too short when the machine's load rose
        during it (seen in CI: too few slowed steps to judge, no straggler found). It then
        lasts until the sensor has flagged it (``DemoFault.slow_played``)."""
        spec = faults.SlowRank(rank=fault.rank, factor=fault.factor, duration_s=SLOW_CAP_S)
        started, first_step, attempt = time.monotonic(), self.watcher.step, self.watcher.attempt
        signals_before = len(self.watcher.signals)

        def flagged() -> bool:
            return any(
                s.signal == "straggler" and s.node == entry.node
                for s in self.watcher.signals[signals_before:]
            )

        def over() -> bool:
            if verdict.at is None and flagged():
                verdict.at = time.monotonic()
            return (
                slowing.done()
                or self.watcher.attempt != attempt
                or fault.slow_played(
                    time.monotonic() - started, self.watcher.step - first_step, flagged()
                )
            )

        slowing = asyncio.create_task(fire(spec, self.ctx))
        try:
            await self._wait(over)
        finally:
            if verdict.at is None:
                verdict.at = time.monotonic()
            entry.fault = replace(fault, duration_s=time.monotonic() - started)
            if not flagged():
                entry.detail += f"; not flagged in its {entry.fault.duration_s:.0f} s"
            slowing.cancel()  # the chaos tool's slow-rank sets the rank's pace back as it ends
            await asyncio.gather(slowing, return_exceptions=True)

    async def _node_of(self, fault: DemoFault) -> str | None:
        """The node of the fault's rank; None (recorded as not applied) when it cannot be found.

        A fault strikes a running job. Its step can come just as a relaunch stops every rank
        (CI, under load: a straggler's hot swap at the step of the next fault, which found no
        live rank and was lost): then it waits until the job steps again and looks again."""
        error = ""
        for _ in range(RANK_LOOKUPS):
            try:
                return (await self.ctx.rank(fault.rank)).node
            except ChaosError as exc:
                error = str(exc)
            if not await self._wait(self._job_stepping_since(time.monotonic(), attempt_after=0)):
                break  # the job ended
        self._record(fault, "", False, error)
        return None

    async def _rank_pids(self, node: str) -> list[int]:
        """The live ranks of ``node``: looked for again for a while, since the job status the
        chaos context reads may be out of reach for a moment (a NATS restart), and an empty
        answer would fire the fault at nothing."""
        deadline = time.monotonic() + RANKS_WAIT_S
        while True:
            pids = [p.pid for p in await self.ctx.ranks(node)]
            if pids or time.monotonic() > deadline or self.watcher.ended.is_set():
                return pids
            await asyncio.sleep(0.5)

    def _in_background(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` alongside the scenario; cancelled if the job ends first."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _repair(self, node: str, fault: DemoFault) -> None:
        failed_at = time.monotonic()
        due = await self._wait(
            lambda: fault.repair_due(
                down_s=time.monotonic() - failed_at,
                step=self.watcher.step,
                steps=self.steps,
                job_waits=self.job_waits_for_nodes,
            )
        )
        if not due:
            return  # the job ended first
        outcome = await fire(faults.FailNode(node=node, clear=True), self.ctx)
        self.say(
            f"[green]repair[/] at step {self.watcher.step}: {node} is healthy again"
            if outcome.ok
            else f"[red]repair of {node} failed[/]: {outcome.detail}"
        )
        for entry in self.injected:
            if entry.node == node and entry.fault.action == "fail-node":
                entry.repaired_at_step = self.watcher.step

    def _record(self, fault: DemoFault, node: str, ok: bool, detail: str) -> Injected:
        entry = Injected(self.watcher.step, fault, node, ok, detail, at_ns=time.time_ns())
        self.injected.append(entry)
        where = f" on {node}" if node else ""
        self.say(
            f"[red]fault[/] at step {entry.step}{where}: {fault.action} — {detail}"
            if ok
            else f"[red]fault {fault.action} could not be applied[/]: {detail}"
        )
        return entry


def _chaos_spec(fault: DemoFault, node: str) -> faults.FaultSpec:
    """The chaos tool's fault for a demo fault that is one (a rank's, or its node's)."""
    match fault.action:
        case "kill-rank":
            return faults.KillRank(rank=fault.rank)
        case "hang-rank":
            return faults.HangRank(rank=fault.rank)
        case "fail-node":
            return faults.FailNode(node=node)
        case "sdc":
            return faults.Sdc(node=node)
    raise ValueError(f"{fault.action} is not a chaos fault")
