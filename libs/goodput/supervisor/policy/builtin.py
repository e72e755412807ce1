"""The built-in remediation policy, and the building blocks a user's script may reuse.

It reads the view of ``JobState``: what the actuator reported plus the predicted effect of
commands it has not answered yet, so a spare already promised to a pending hot swap is not
free, and a refused hot swap leaves its node active for the next decision.

Rules, in order (the rule name is what a ``Decision`` shows):

* ``replace-suspect`` — the actuator reports active nodes it places no rank on (a pod deletion
  they never confirmed, ``JobStatus.suspect_nodes``): every launch would be refused, whatever
  the signal, so they are replaced first — one by a free spare (hot swap), several (or none
  free) by a scale to the healthy nodes, each suspect node's place taken by a free spare while
  one is left. A refused launch is decided again (``Controller.settle``): this rung follows it.
* ``scale-up`` — a node came back (``node_returned``) and the job runs below the size it was
  started with: grow by as many whole replicas as the free spares allow.
  ``spare-kept`` — it came back but the job is at full size: it stays a spare.
* ``evict-straggler-hot-swap`` / ``evict-straggler-scale-down`` / ``straggler-tolerated`` — a
  straggler slows every replica: the remedy whose expected cost is least
  (:mod:`goodput.supervisor.policy.remedy`: its slowdown until the next expected restart, a restart's
  measured downtime, a replica's share of the job), every figure in the reason. The last
  replica is never dropped: a slow job beats no job.
* ``in-process-restart`` — a correctable crash or hang: the surviving ranks restart in their
  processes (model and optimizer kept, the checkpoint from host memory) and only the lost
  rank is started again — by its node's ready standby when it has one (the job's state
  built ahead of time), else cold. ``standby-restart`` — a correctable fault that cannot be
  healed in process (a rank whose heartbeats stopped is frozen), or one whose in-process
  restart failed (a rank stuck past the deadline), while the nodes keep ready standbys:
  every rank restarts from the newest checkpoint, as many as there are standbys in them.
  ``in-job-restart`` — the same with no standby ready: the worker group restarts cold.
  Every other command that launches ranks (GPU reset, hot swap — the spare's standbys —,
  scale down or up) takes them from ready standbys too, and its reason says how many.
* ``gpu-app-fault`` — GPU faults the fault table (``goodput.gpu_faults``) says the node
  survives: an application's XID (13, 31, 43, 68, 109), a contained ECC error (94), or any
  one the driver's recovery action calls harmless: restart every rank on the same nodes.
  ``gpu-no-action`` — only faults that ask for nothing (XID 45, 92): no command.
* ``gpu-reset`` — a host fault whose remedy in the fault table is a GPU reset (the
  catalogue's reset XIDs, uncorrected ECC errors, the driver asking for one) on a node that has not failed
  ``REPEAT_FAILURES`` times: restart with the node's faulty GPUs reset while no rank runs
  (the actuator stops the ranks, the node's host monitor resets, the actuator relaunches).
  If the reset fails or times out, the actuator fails the restart and the signal is decided
  again: the node is replaced (``hot-swap``, else ``scale-down``), since a cold restart would
  meet the same GPU fault.
* ``node-healthy`` — an active node's host faults cleared (after a GPU reset): nothing to do.
* ``repeat-offender`` — a node failing for the ``REPEAT_FAILURES``-th time with a fault that
  looked correctable is treated as broken. (An uncorrectable fault replaces the node anyway and
  keeps its own rule: a lost node often shows as its ranks' crash before its host's fault, and
  that one loss must not read as a third failure.)
* ``hot-swap`` — an uncorrectable fault (a lost host, a GPU XID whose remedy is a reboot,
  e.g. 79) and a free spare: replace it.
* ``scale-down`` — no spare: drop the node and regroup the healthy nodes into fewer replicas.
* ``no-capacity`` — not one whole replica is left: stop the job, saying so.
* ``restart-job`` — a job-wide fault with no node to blame (``job_down``): restart it all.
  ``job-oom`` — every rank ran out of GPU memory after its warm retry (``Signal.rank_fault``
  on a signal naming no node): the job's memory, not a node's, so every rank restarts cold
  and no node is blamed (a repeat is the crash-loop guard's to stop, never a node's eviction).
* ``numerical-rollback`` — a numerical fault (``nonfinite``, ``loss_spike``, a first
  ``replica_mismatch``): restart every rank from the newest checkpoint before
  ``Signal.first_bad_step`` (``Restart.restore_before_step``; the shim discards its volume's
  newer ones, which hold the fault); a loss spike's also skips the batches of the window it
  was seen in (``Restart.skip_steps``: a poisoned batch would spike again). ``numerical-quarantine`` — a node whose replica
  disagreed again (the detector's ``uncorrectable``): replace it (hot swap, else scale down)
  and roll back the same way.

A crash whose rank's CUDA context was poisoned (``rank_fault`` ``cuda-context``) or that ran
out of GPU memory alone (``cuda-oom`` on a node) takes the rungs of any crash: that rank left
at once and is started cold (a new context, an empty allocator), the survivors restart in
process; the reason says so.

A rung the actuator's backend declares it cannot run (``JobState.backend``) is skipped with
the reason in the decision, as is an in-process restart the job's ranks cannot do
(``JobState.in_process_restart``): the next rung down is chosen, never a command the actuator
would refuse. An undeclared capability (an actuator that does not say) is tried.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from goodput import schemas
from goodput.gpu_faults import node_remedy, reset_targets
from goodput.supervisor.jobstate.model import JobState, Refusal
from goodput.supervisor.policy.plan import Plan
from goodput.supervisor.policy.remedy import HOT_SWAP, SCALE_DOWN, straggler_costs

REPEAT_FAILURES = 3
#: the rule of a Stop for want of healthy nodes: `goodput run` then exits with
#: goodput.launch.exit_reason.RUN_CANNOT_CONTINUE_EXIT_CODE (a new allocation may continue);
#: a policy script that stops for the same reason may name its rule so
NO_CAPACITY_RULE = "no-capacity"

#: a field of ``BackendCapabilities``: what a rung needs of the backend
Capability = Literal["in_process_restart", "standbys", "gpu_reset", "hot_swap", "scale"]
#: what each capability lets the backend do, for a decision's reason
CAPABILITY_WORDS: dict[Capability, str] = {
    "in_process_restart": "restart ranks in process",
    "standbys": "keep standby ranks",
    "gpu_reset": "reset GPUs",
    "hot_swap": "hot-swap nodes",
    "scale": "change the job's size",
}


def backend_lacks(state: JobState, capability: Capability) -> str:
    """Why the backend cannot run the rung that needs ``capability`` ("" when it can, or when
    it did not declare what it can do)."""
    declared = state.backend
    if declared is None or getattr(declared, capability) not in (False, "none"):
        return ""
    return f"the {declared.backend} backend cannot {CAPABILITY_WORDS[capability]}"


def standby_ranks(state: JobState, nodes: list[str]) -> int:
    """How many of the ranks launched on ``nodes`` ready standbys can be (one rank each)."""
    if backend_lacks(state, "standbys"):
        return 0
    return sum(min(state.standbys.get(node, 0), state.procs_per_node) for node in nodes)


def standby_note(state: JobState, nodes: list[str]) -> tuple[bool, str]:
    """Whether a launch on ``nodes`` should take standbys, and the words for its reason."""
    warm = standby_ranks(state, nodes)
    if not warm:
        return False, ""
    return True, f"; {warm} of {len(nodes) * state.procs_per_node} rank(s) from ready standbys"


def default_policy(signal: schemas.Signal, state: JobState) -> Plan:
    """The built-in policy: in-process and in-job restart, GPU reset, hot swap, scale down, scale up, evict
    stragglers."""
    kind = signal.signal
    suspect = [n.name for n in state.nodes if n.role == "active" and n.suspect]
    if suspect:
        return replace_suspects(state, suspect, why=f"{kind} on {signal.node or 'the job'}")
    if kind == "node_returned":
        if state.role_of(signal.node) == "active":
            return Plan([], "node-healthy", f"{signal.node} is healthy again and in the job")
        return scale_up(state, why=f"{signal.node} is back")
    if kind == "straggler":
        return evict_straggler(signal, state)
    if kind in schemas.NUMERICAL_SIGNALS:
        return roll_back(signal, state)
    record = state.node(signal.node) if signal.node else None
    if record is None and signal.rank_fault == "cuda-oom":
        warm, note = standby_note(state, state.active)
        return Plan(
            [schemas.Restart(job=state.job, standbys=warm)],
            "job-oom",
            f"{signal.detail}: restart every rank cold from the newest checkpoint, no node "
            f"blamed (fit the job to its GPUs' memory if it repeats){note}",
        )
    if record is None:
        warm, note = standby_note(state, state.active)
        return Plan(
            [schemas.Restart(job=state.job, standbys=warm)],
            "restart-job",
            f"{kind} with no node to blame ({signal.detail}): restart the whole job{note}",
        )
    if signal.severity == "correctable":
        if record.failures >= REPEAT_FAILURES:
            why = f"{signal.node} failed {record.failures} times"
            plan = replace_node(state, signal.node, why=why)
            return Plan(plan.commands, "repeat-offender", plan.reason)
        return restart_in_place(signal, state)
    kept = keep_node(signal, state)
    if kept is not None:
        return kept
    reset = reset_gpus(signal, state)
    if reset is not None:
        return reset
    why = f"uncorrectable {kind} on {signal.node}"
    if record.gpu_reset_failed:
        why += f" (GPU reset failed: {record.gpu_reset_failed})"
    elif reset_targets(signal.host_faults, signal.gpus) is not None and (
        lacks := backend_lacks(state, "gpu_reset")
    ):
        why += f" (reset-correctable, but {lacks})"
    return replace_node(state, signal.node, why=why)


def keep_node(signal: schemas.Signal, state: JobState) -> Plan | None:
    """The rung for GPU faults the fault table says the node survives (``goodput.gpu_faults``:
    the application's XIDs, a contained ECC error, a driver saying no recovery is needed),
    or None where it does not apply.

    The job restarts on the same nodes (``gpu-app-fault``); a fault that asks for nothing
    (XID 45, the cleanup after a killed application) changes nothing (``gpu-no-action``).
    """
    record = state.node(signal.node)
    remedy = node_remedy(signal.host_faults, signal.gpus)
    if record is None or record.role != "active" or remedy is None:
        return None
    if remedy.action not in ("none", "restart"):
        return None
    where = f"{', '.join(signal.host_faults)} on {signal.node}"
    if remedy.action == "none":
        return Plan([], "gpu-no-action", f"{where} needs no remedy ({remedy.reason})")
    warm, note = standby_note(state, state.active)
    return Plan(
        [schemas.Restart(job=state.job, standbys=warm)],
        "gpu-app-fault",
        f"{where} is the application's ({remedy.reason}): restart every rank from the newest "
        f"checkpoint, {signal.node} kept{note}",
    )


def reset_gpus(signal: schemas.Signal, state: JobState) -> Plan | None:
    """The GPU-reset rung for a host fault, or None where it does not apply.

    It applies to an active node whose every fault a GPU reset clears, which has not failed
    ``REPEAT_FAILURES`` times and whose last reset did not fail, on a backend that can reset.
    """
    record = state.node(signal.node)
    if record is None or record.role != "active" or record.gpu_reset_failed:
        return None
    if backend_lacks(state, "gpu_reset"):
        return None
    if record.failures >= REPEAT_FAILURES:
        return None
    targets = reset_targets(signal.host_faults, signal.gpus)
    if targets is None:
        return None
    which = f"GPU(s) {', '.join(map(str, targets))}" if targets else "every GPU"
    # the reset node's standbys are stopped for the reset (they may hold the GPU)
    warm, note = standby_note(state, [n for n in state.active if n != signal.node])
    return Plan(
        [schemas.Restart(job=state.job, reset_gpus={signal.node: targets}, standbys=warm)],
        "gpu-reset",
        f"{', '.join(signal.host_faults)} on {signal.node} is reset-correctable: stop the "
        f"ranks, reset {which} of {signal.node}, restart from the newest checkpoint{note}",
    )


#: what a crash's CUDA cause adds to a decision's reason: that rank cannot be restarted warm
CUDA_CAUSES: dict[str, str] = {
    "cuda-context": " (rank's CUDA context poisoned: it left at once and restarts cold)",
    "cuda-oom": " (rank out of GPU memory after its warm retry: it restarts cold)",
}

#: faults whose surviving ranks can unwind their step: a dead peer fails their collectives, a
#: hung Python loop is woken by the Rejoin; a rank that stopped heartbeating is frozen
IN_PROCESS_KINDS = ("crash", "hang")


def restart_in_place(signal: schemas.Signal, state: JobState) -> Plan:
    """Warm when it can work: in process, unless the fault's kind rules it out or an
    in-process restart for this very signal already failed; otherwise cold."""
    where = f"correctable {signal.signal} on {signal.node}" + CUDA_CAUSES.get(signal.rank_fault, "")
    failed = warm_restart_failure(signal, state)
    # a crash of the only rank leaves no process to restart in
    survivors = signal.signal != "crash" or state.world_size > 1
    # a job whose ranks declared they cannot (a framework's loop), or a backend that cannot,
    # is not sent the command
    capable = state.in_process_restart is not False
    backend = backend_lacks(state, "in_process_restart")
    if (
        signal.signal in IN_PROCESS_KINDS
        and survivors
        and capable
        and not backend
        and failed is None
    ):
        # a hang loses no rank: every one restarts in process
        warm = signal.signal == "crash" and standby_ranks(state, [signal.node]) > 0
        lost = f"the lost ones from {signal.node}'s standby" if warm else "the lost ones cold"
        return Plan(
            [schemas.RestartInProcess(job=state.job, standbys=warm)],
            "in-process-restart",
            f"{where}: the surviving ranks restart in process, {lost}, from the step every "
            "rank holds",
        )
    why = (
        f"the in-process restart failed: {failed.reason}"
        if failed is not None
        else f"a {signal.signal} cannot be healed in process"
        if signal.signal not in IN_PROCESS_KINDS
        else "no rank survived"
        if not survivors
        else "the job's ranks cannot restart in process: their loop is not the shim's"
        if not capable
        else backend
    )
    warm, note = standby_note(state, state.active)
    if warm:
        return Plan(
            [schemas.Restart(job=state.job, standbys=True)],
            "standby-restart",
            f"{where}: restart every rank from the newest checkpoint ({why}){note}",
        )
    return Plan(
        [schemas.Restart(job=state.job)],
        "in-job-restart",
        f"{where}: restart every rank cold from the newest checkpoint ({why})",
    )


def warm_restart_failure(signal: schemas.Signal, state: JobState) -> Refusal | None:
    """The refusal of an in-process restart issued for ``signal`` (after it was observed)."""
    observed = signal.observed_ts or signal.ts
    return next(
        (
            r
            for r in reversed(state.refused)
            if r.action == schemas.kind_of(schemas.RestartInProcess) and r.ts >= observed
        ),
        None,
    )


def roll_back(signal: schemas.Signal, state: JobState) -> Plan:
    """A numerical fault: every rank restarts from the newest checkpoint before the first step
    it may have touched; a repeat offender's node is replaced on the way."""
    before = max(signal.first_bad_step, 0)
    why = f"{signal.signal} ({signal.detail})"
    back = f"roll back to the newest checkpoint before step {before}"
    if signal.severity == "uncorrectable" and signal.node:
        plan = replace_node(state, signal.node, why=f"{why}; quarantine {signal.node}")
        commands = [
            msgspec.structs.replace(c, restore_before_step=before)
            if isinstance(c, (schemas.HotSwap, schemas.ScaleTo))
            else c
            for c in plan.commands
        ]
        return Plan(commands, "numerical-quarantine", f"{plan.reason}; {back}")
    warm, note = standby_note(state, state.active)
    skip = spike_window(signal)
    skipped = f"; skip the batches of steps {skip.first}-{skip.last}" if skip else ""
    restart = schemas.Restart(
        job=state.job, standbys=warm, restore_before_step=before, skip_steps=skip
    )
    return Plan([restart], "numerical-rollback", f"{why}: {back}{skipped}{note}")


def spike_window(signal: schemas.Signal) -> schemas.StepWindow | None:
    """The steps whose batches a loss spike's rollback skips: the window it was seen in (a
    poisoned batch is one of them, and training on it again would spike again). A NaN or a
    replica mismatch skips none: a diverging step or a flipped bit is no batch's fault."""
    if signal.signal != "loss_spike" or not 1 <= signal.first_bad_step <= signal.last_bad_step:
        return None
    return schemas.StepWindow(signal.first_bad_step, signal.last_bad_step)


def replace_node(state: JobState, node: str, *, why: str) -> Plan:
    """Hot swap ``node`` for a spare if one is free (and the backend can), else scale down
    without it."""
    lacks = backend_lacks(state, "hot_swap")
    if state.spares and lacks:
        return scale_down(state, node, why=f"{why}, a spare is free but {lacks}")
    if state.spares:
        spare = state.spares[0]
        warm, note = standby_note(state, [spare if n == node else n for n in state.active])
        return Plan(
            [schemas.HotSwap(job=state.job, failed_node=node, spare_node=spare, standbys=warm)],
            "hot-swap",
            f"{why}: swap in spare {spare}{note}",
        )
    return scale_down(state, node, why=f"{why}, no spare free")


def replace_suspects(state: JobState, suspect: list[str], *, why: str) -> Plan:
    """Replace the active nodes the actuator will not place a rank on: a hot swap for one
    when a spare is free (and the backend can), else a scale to the other active nodes, each
    suspect node's place taken by a free spare while one is left, in whole replicas."""
    why = f"{why}; {', '.join(suspect)} never confirmed a pod's deletion, no rank goes there"
    free = [n.name for n in state.nodes if n.role == "spare" and not n.suspect and not n.down]
    if len(suspect) == 1 and free and not backend_lacks(state, "hot_swap"):
        node, spare = suspect[0], free[0]
        warm, note = standby_note(state, [spare if n == node else n for n in state.active])
        return Plan(
            [schemas.HotSwap(job=state.job, failed_node=node, spare_node=spare, standbys=warm)],
            "replace-suspect",
            f"{why}: swap in spare {spare}{note}",
        )
    dropped = set(suspect)
    spares = iter(free)
    nodes = [n if n not in dropped else next(spares, "") for n in state.active]
    nodes = [n for n in nodes if n]
    replicas = len(nodes) // state.num_nodes_per_dp
    lacks = backend_lacks(state, "scale")
    if lacks or replicas < 1:
        why = f"{why}; {lacks or 'not one whole replica left'}"
        return Plan([schemas.Stop(job=state.job, reason=why)], "replace-suspect", why)
    keep = nodes[: replicas * state.num_nodes_per_dp]
    warm, note = standby_note(state, keep)
    command = schemas.ScaleTo(
        job=state.job, num_dp_replicas=replicas, nodes=keep, drop_nodes=suspect, standbys=warm
    )
    return Plan(
        [command],
        "replace-suspect",
        f"{why}: run on {len(keep)} node(s), {replicas} DP replica(s){note}",
    )


def scale_down(state: JobState, node: str, *, why: str) -> Plan:
    """Drop ``node``; the healthy active nodes regroup into as many whole replicas as they can."""
    remaining = [n for n in state.active if n != node]
    replicas = len(remaining) // state.num_nodes_per_dp
    lacks = backend_lacks(state, "scale")
    if lacks:
        return Plan(
            [schemas.Stop(job=state.job, reason=f"{why}; {lacks}")],
            NO_CAPACITY_RULE,
            f"{why}: {lacks} and no other rung is left, stopping",
        )
    if replicas < 1:
        return Plan(
            [schemas.Stop(job=state.job, reason=f"{why}; not one whole replica left")],
            NO_CAPACITY_RULE,
            f"{why}: fewer than {state.num_nodes_per_dp} healthy node(s) left, stopping",
        )
    keep = remaining[: replicas * state.num_nodes_per_dp]
    warm, note = standby_note(state, keep)
    return Plan(
        [
            schemas.ScaleTo(
                job=state.job,
                num_dp_replicas=replicas,
                nodes=keep,
                drop_nodes=[node],
                standbys=warm,
            )
        ],
        "scale-down",
        f"{why}: scale down from {state.num_dp_replicas} to {replicas} DP replica(s){note}",
    )


def scale_up(state: JobState, *, why: str) -> Plan:
    """Grow back towards the starting size with whole replicas of free spares."""
    missing = state.target_dp_replicas - state.num_dp_replicas
    affordable = len(state.spares) // state.num_nodes_per_dp
    grow = min(missing, affordable)
    lacks = backend_lacks(state, "scale")
    if grow >= 1 and lacks:
        return Plan(
            [],
            "spare-kept",
            f"{why}; kept as a spare ({lacks}, {state.num_dp_replicas} of "
            f"{state.target_dp_replicas} replicas running)",
        )
    if grow < 1:
        return Plan(
            [],
            "spare-kept",
            f"{why}; kept as a spare ({state.num_dp_replicas} of {state.target_dp_replicas} "
            f"replicas running, {len(state.spares)} spare(s) free)",
        )
    replicas = state.num_dp_replicas + grow
    nodes = state.active + state.spares[: grow * state.num_nodes_per_dp]
    warm, note = standby_note(state, nodes)
    return Plan(
        [schemas.ScaleTo(job=state.job, num_dp_replicas=replicas, nodes=nodes, standbys=warm)],
        "scale-up",
        f"{why}: scale up from {state.num_dp_replicas} to {replicas} DP replica(s){note}",
    )


def evict_straggler(signal: schemas.Signal, state: JobState) -> Plan:
    """The cheapest remedy by :func:`goodput.supervisor.policy.remedy.straggler_costs`, figures said."""
    node = signal.node
    lacks = {HOT_SWAP: backend_lacks(state, "hot_swap"), SCALE_DOWN: backend_lacks(state, "scale")}
    costs = straggler_costs(signal, state, ruled_out=frozenset(k for k, v in lacks.items() if v))
    cannot = "".join(f"; {why}" for why in lacks.values() if why)
    why = f"straggler {node} ({costs.reason()}{cannot})"
    choice = costs.cheapest
    if choice == HOT_SWAP:
        plan = replace_node(state, node, why=why)
        return Plan(plan.commands, "evict-straggler-hot-swap", plan.reason)
    if choice == SCALE_DOWN:
        plan = scale_down(state, node, why=why)
        return Plan(plan.commands, "evict-straggler-scale-down", plan.reason)
    return Plan([], "straggler-tolerated", f"{why}: slow training costs least")
