"""The world's faults: when a fault strikes, what the sensor hears of it, and the repair.

A mixin of :class:`goodput.tools.simulate.world.World` (it uses the world's clock, membership,
training state and sensor feed), kept apart so each file has one job: the world runs the
loop and training, this decides what a crash, hang, GPU XID, lost host, demo node loss or
straggler sends to the real sensor — the events a real rank, host monitor or actuator would.
"""

from __future__ import annotations

from goodput.tools.simulate import messages as msg
from goodput.tools.simulate.fleet import BREAKING, RESET_CLEARS, XIDS, Fault
from goodput.tools.simulate.records import NS, T0, FedRank, Slowing
from goodput.tools.simulate.world_parts import WorldParts


class FaultsMixin(WorldParts):
    def _step_events(self) -> None:
        """A replayed run's faults and repairs that come due at the step just done."""
        for due, node in [r for r in self._repairs_at_step if r[0] <= self.step]:
            self._repairs_at_step.remove((due, node))
            self._repaired(node)
        while self._step_faults and self._step_faults[0].at_step <= self.step:
            fault = self._step_faults.pop(0)
            at_ns = self.now + int(fault.delay_s * NS)
            strikes = Fault(
                (at_ns - T0) / NS,
                fault.node,
                fault.kind,
                fault.duration_s,
                fault.factor,
                fault.slowdown,
                fault.slowed_steps,
                fault.after_step_s,
            )
            if at_ns > self.now:
                self._at(at_ns, self._fault, strikes)
            else:
                self._fault(strikes)
            if fault.repair_at_step is not None:
                self._repairs_at_step.append((fault.repair_at_step, fault.node))

    def _fault(self, fault: Fault) -> None:
        node = fault.node
        if node in self._broken:
            return  # already down: a broken node cannot fail again
        active = self.actuator.membership.active
        if fault.kind == "straggler":
            # its first slowed step is the next one
            self._straggling[node] = Slowing(
                fault.slowdown or fault.factor,
                fault.slowed_steps,
                self.step + 1,
                fault.after_step_s,
                self.actuator.attempt,
            )
            self._compute_factor[node] = fault.factor
            self._straggle_changes += 1
            self._at(self.now + int(fault.duration_s * NS), self._straggler_ends, node)
            if node in active and self.phase in ("running", "saving"):
                self._watch_straggler(active.index(node), node)
            return
        if fault.kind == "sdc":  # training goes on; the next fingerprint step tells
            if node in active:
                self._corrupt[node] = self.actuator.attempt
            return
        if fault.kind in BREAKING:
            self._broken[node] = fault.kind
            if fault.duration_s:
                self._at(self.now + int(fault.duration_s * NS), self._repaired, node)
        if node not in active:
            if fault.kind in XIDS:  # a spare's host monitor reports it too
                self._manifest(-1, node, fault.kind)
            return
        self.interruptions += 1
        if self.phase == "restart":
            return  # the relaunch meets it (a broken node) or replaces the crashed process
        if self.phase in ("running", "saving", "restore", "startup"):
            self._fail()
        self._manifest(active.index(node), node, fault.kind)

    def _fail(self) -> None:
        """Training stops: the ranks wait for a peer that will never answer."""
        if self._failure_ns is None:
            self._failure_ns = self.now
        self._gen += 1
        self._next_step = None
        for fed in self._fed.values():
            fed.stepping = False
        self.phase = "detect"

    def _manifest(self, position: int, node: str, kind: str) -> None:
        """What the sensor gets from a fault on ``node`` (the rank at ``position``)."""
        rank = max(position, 0) * self.job.gpus_per_node
        attempt = self.actuator.attempt
        probe = int(self.profile.detection.host_probe_s * NS)
        if kind == "crash":
            self.actuator.dead.add(node)
            self._fed.pop(rank, None)
            exited = msg.rank_exited(node, rank, self.now, attempt, exit_code=1)
            self.stream.append(exited)  # the agent's report, with the time of the exit
            self._feed_later(self._latency, exited)
        elif kind == "hang":
            if rank not in self._fed:
                # its last finished step is one behind the peers that wait for it
                self._register(rank, FedRank(node, stepping=False))
                step, time_s = max(self.step - 1, 0), self._step_s
                self._feed(msg.step_done(node, rank, self.now, step, time_s, 0.0, len(self._fed)))
        elif kind in XIDS:
            self._feed_later(probe, msg.host_report(node, self.now, attempt, xid=XIDS[kind]))
        elif kind == "node_down":
            # the demo's node loss: its host monitor reports the node down at once (a change
            # is reported when it happens), then the exit of its killed ranks arrives
            self.actuator.dead.add(node)
            self._fed.pop(rank, None)
            down = msg.host_report(node, self.now, attempt, faults=("node_down",))
            self._feed_later(self._latency, down)
            exited = msg.rank_exited(node, rank, self.now, attempt, signal=9)
            self.stream.append(exited)
            self._feed_later(2 * self._latency, exited)
        elif kind == "lost_host":
            fed = self._fed.get(rank) or self._register(rank, FedRank(node))
            fed.heartbeating = fed.stepping = False

    def _fingerprints(self) -> None:
        """A fingerprint step: rank 0's window says the replicas agreed (the step a rollback
        may go back to), or, while a replica of this attempt is corrupt, the split; training
        then stops for the rollback (which throws away the steps since the corruption). A
        relaunch reloads the parameters: an older attempt's flip is gone."""
        active = self.actuator.membership.active
        corrupt = [n for n, a in self._corrupt.items() if a == self.actuator.attempt]
        self._corrupt.clear()
        ranks = {node: position * self.job.gpus_per_node for position, node in enumerate(active)}
        bad = [ranks[node] for node in corrupt if node in ranks]
        if not bad:
            self._feed(msg.replicas_agree(active[0], self.now, self.step))
            return
        for node in corrupt:
            if ranks[node] not in self._fed:
                self._register(ranks[node], FedRank(node))
        self.interruptions += 1
        self._fail()
        good = [rank for node, rank in ranks.items() if node not in corrupt]
        split = msg.replicas_split(active[0], self.now, self.step, good, bad)
        self._feed_later(self._latency, split)

    def _register(self, rank: int, fed: FedRank) -> FedRank:
        """The sensor learns of a rank of this attempt that it has not followed so far."""
        self._fed[rank] = fed
        world = len(self.actuator.membership.active) * self.job.gpus_per_node
        self._feed(msg.rank_started(fed.node, rank, self.now, world, self.actuator.attempt))
        self._beat(rank, fed)
        return fed

    def _watch_straggler(self, position: int, node: str) -> None:
        rank = position * self.job.gpus_per_node
        fed = self._fed.get(rank) or self._register(rank, FedRank(node))
        fed.compute_factor = self._compute_factor.get(node, 1.0)

    def _slowdown(self, step: int) -> float:
        """How much slower the job does ``step``: its slowest active node (cached per change,
        but for a replay's step-by-step slowdown)."""
        key = (self.actuator.attempt, self._straggle_changes)
        if key != self._slow_key:
            active = set(self.actuator.membership.active)
            self._slow_key = key
            slowing = [s for n, s in self._straggling.items() if n in active]
            self._slow = max((s.mean for s in slowing), default=1.0)
            self._stepwise = slowing if any(s.steps for s in slowing) else []
        if self._stepwise:
            return max(s.at(step) for s in self._stepwise)
        return self._slow

    def _step_time(self, step: int) -> float:
        """How long the job takes for ``step``: a replayed attempt's measured time for it,
        unless a straggler slows it, else the attempt's healthy step time, slowed."""
        return self._pace.step_s(step, self._step_s, self._slowdown(step))

    def _straggler_ends(self, node: str) -> None:
        slowing = self._straggling.pop(node, None)
        if slowing is None:
            return
        if slowing.after_step_s and slowing.attempt == self.actuator.attempt:
            self._step_s = slowing.after_step_s  # a replay: the pace its run kept after it
        self._compute_factor.pop(node, None)
        self._straggle_changes += 1
        for fed in self._fed.values():
            if fed.node == node:
                fed.compute_factor = 1.0
        if self.phase in ("running", "saving") and self._next_step is not None:
            self._next_step = self.now + self._step_ns()

    def _gpus_reset(self, nodes: list[str]) -> None:
        """A restart reset these nodes' GPUs: a fault a reset clears is gone."""
        for node in nodes:
            if self._broken.get(node) in RESET_CLEARS:
                self._repaired(node)

    def _repaired(self, node: str) -> None:
        """The node is healthy again; its host monitor says so."""
        self._broken.pop(node, None)
        self._feed(msg.host_report(node, self.now, self.actuator.attempt))
