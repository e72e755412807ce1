"""Which nodes run the job, which wait as spares, which failed: the one set of membership rules.

The actuator owns membership: it executes every change with these rules and reports the result
in ``JobStatus``. The controller never changes membership itself; it predicts what a command it
sent but has not seen answered will do with the same rules (:meth:`Membership.after`), so a
policy and the actuator can never disagree about what a hot swap or a scale means.
"""

from __future__ import annotations

import msgspec

from goodput import schemas
from goodput.launch import capacity


class MembershipError(ValueError):
    """A command that cannot apply to the current membership (unknown node, no spare…)."""


class Membership(msgspec.Struct, kw_only=True):
    active: list[str]
    spares: list[str]
    failed: list[str] = msgspec.field(default_factory=list)
    procs_per_node: int = 1

    @classmethod
    def initial(cls, nodes: int, spares: int, procs_per_node: int) -> Membership:
        names = [f"node-{i}" for i in range(nodes + spares)]
        return cls(active=names[:nodes], spares=names[nodes:], procs_per_node=procs_per_node)

    def after(self, command: schemas.Command) -> Membership:
        """The membership once ``command`` is executed (unchanged by a non-membership command).

        Raises :class:`MembershipError` where the actuator would refuse it.
        """
        match command:
            case schemas.HotSwap():
                return self.hot_swap(command.failed_node, command.spare_node)[0]
            case schemas.ScaleTo():
                return self.scale_to(list(command.nodes), list(command.drop_nodes))
            case schemas.ReturnNode():
                return self.return_node(command.node)
        return self

    def newly_failed(self, command: schemas.Command) -> list[str]:
        """The nodes ``command`` makes count as failed (a hot swap's failed node, a scale's
        dropped ones); none for a command the actuator would refuse. Their checkpoint tier
        goes with them: the actuator withdraws their addresses from the checkpoint index
        rather than let every peer wait out the node TTL (a node that still lives says so
        again at its next poll)."""
        try:
            after = self.after(command)
        except MembershipError:
            return []
        before = set(self.failed)
        return [node for node in after.failed if node not in before]

    @property
    def world_size(self) -> int:
        return len(self.active) * self.procs_per_node

    def node_index(self, node: str) -> int:
        """An active node's place in the launch order: its ranks are ``index x procs_per_node
        + local rank`` (``GROUP_RANK``), and it holds part ``index`` of a checkpoint sharded
        across nodes. A hot swap keeps the index, so the spare takes the failed node's part."""
        try:
            return self.active.index(node)
        except ValueError:
            raise MembershipError(f"node {node!r} is not active") from None

    def known(self, node: str) -> bool:
        return node in self.active or node in self.spares or node in self.failed

    def _require_known(self, node: str) -> None:
        if not self.known(node):
            raise MembershipError(
                f"unknown node {node!r}; known: {', '.join(self.active + self.spares + self.failed)}"
            )

    def hot_swap(self, failed: str, spare: str = "") -> tuple[Membership, str]:
        """Put a spare in the failed node's place (same rank positions, same world size).

        A named ``spare`` may be one this membership still counts as failed: as in
        :meth:`scale_to`, the controller decides, and it names a node it has seen return
        (a repaired node it kept as a spare is not announced to the actuator on its own).
        """
        self._require_known(failed)
        if failed not in self.active:
            raise MembershipError(f"node {failed!r} is not active; nothing to swap")
        if spare and spare not in self.spares and spare not in self.failed:
            raise MembershipError(f"node {spare!r} is not a spare")
        if not spare and not self.spares:
            raise MembershipError("no spare node available")
        chosen = spare or self.spares[0]
        active = [chosen if n == failed else n for n in self.active]
        spares = [n for n in self.spares if n != chosen]
        return (
            Membership(
                active=active,
                spares=spares,
                failed=[*(n for n in self.failed if n != chosen), failed],
                procs_per_node=self.procs_per_node,
            ),
            chosen,
        )

    def scale_to(self, nodes: list[str], drop: list[str]) -> Membership:
        """Run on ``nodes`` (or the active ones minus ``drop``); dropped nodes count as failed."""
        # sets: list lookups made a scale of thousands of nodes quadratic
        known = {*self.active, *self.spares, *self.failed}
        for node in nodes + drop:
            if node not in known:
                self._require_known(node)
        dropping = set(drop)
        # the controller decides membership: a failed node it names has been judged healthy
        wanted = (
            list(dict.fromkeys(nodes)) if nodes else [n for n in self.active if n not in dropping]
        )
        if not wanted:
            raise MembershipError("scaling to zero nodes would stop the job; send stop instead")
        keep = set(wanted)
        left = [n for n in self.active if n not in keep]
        dropped_failed = [n for n in left if n in dropping]
        dropped_spare = [n for n in left if n not in dropping]
        return Membership(
            active=wanted,
            spares=[n for n in self.spares if n not in keep] + dropped_spare,
            failed=[*(n for n in self.failed if n not in keep), *dropped_failed],
            procs_per_node=self.procs_per_node,
        )

    def return_node(self, node: str) -> Membership:
        """A repaired node joins the spare pool."""
        self._require_known(node)
        if node in self.active or node in self.spares:
            return self
        return Membership(
            active=list(self.active),
            spares=[*self.spares, node],
            failed=[n for n in self.failed if n != node],
            procs_per_node=self.procs_per_node,
        )

    def fail_node(self, node: str) -> Membership:
        """A spare known to be broken (host monitor, chaos) leaves the spare pool.

        An active node that breaks is replaced or dropped by a hot swap or a scale-down.
        """
        self._require_known(node)
        if node in self.active:
            raise MembershipError(f"node {node!r} is active: hot-swap or drop it instead")
        if node in self.failed:
            return self
        return Membership(
            active=list(self.active),
            spares=[n for n in self.spares if n != node],
            failed=[*self.failed, node],
            procs_per_node=self.procs_per_node,
        )


def check_job_shape(spec: schemas.StartJob) -> None:
    """Refuse a job no membership can run (no nodes, no ranks, partial replicas) or past
    the documented maxima (``goodput.launch.capacity``: a StartJob may come from anyone)."""
    per_dp = spec.num_nodes_per_dp
    if spec.nodes < 1 or spec.procs_per_node < 1 or spec.spares < 0 or per_dp < 1:
        raise MembershipError(
            f"a job needs at least 1 node, 1 rank per node, 0 or more spares and at least 1 "
            f"node per data-parallel replica (got {spec.nodes} node(s), {spec.procs_per_node} "
            f"rank(s) per node, {spec.spares} spare(s), {per_dp} node(s) per replica)"
        )
    too_big = capacity.job_problems(
        nodes=spec.nodes,
        procs_per_node=spec.procs_per_node,
        spares=spec.spares,
        standbys=spec.standbys,
    )
    if too_big:
        raise MembershipError("; ".join(too_big))
    if spec.nodes % per_dp:
        raise MembershipError(
            f"{spec.nodes} node(s) do not form whole replicas of {per_dp} node(s)"
        )
