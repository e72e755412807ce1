"""The policy extension API: what a remediation policy script imports.

A policy is a Python file defining::

    def decide(signal: goodput.schemas.Signal, state: goodput.supervisor.policy.JobState)
        -> goodput.supervisor.policy.Plan | list[goodput.schemas.Command]

It returns the commands to issue, chosen from :data:`ALLOWED_COMMANDS` and built with
``job=state.job`` (ids, timestamps and the decision link are filled in by the controller).
Returning a :class:`Plan` adds the rule name and a sentence saying why, which end up in the
published ``Decision``; a bare list is reported as rule ``"script"``; ``[]`` means "do
nothing". A script may call the built-in policy (:func:`default_policy`) or its building
blocks (:func:`scale_down`, :func:`scale_up`, :func:`replace_node`, :func:`replace_suspects`:
the nodes the actuator places no rank on, ``NodeRecord.suspect``; :func:`evict_straggler`,
:func:`reset_gpus`, :func:`roll_back`: a numerical fault's rollback to the newest
checkpoint before ``Signal.first_bad_step``, :func:`standby_note`: whether a launch on some nodes should take their
ready standbys, ``JobState.standbys``; :func:`backend_lacks`: why the actuator's backend
cannot run a rung, from what it declared, ``JobState.backend``) and change only what it wants. It gets copies of the signal and the state: changing them
changes nothing. Its answer must pass :func:`validate`, or the built-in policy decides.

``JobState`` is what the actuator reported (membership, attempt), the commands it has not
answered yet (``pending``, whose effect the view already shows) and those it refused
(``refused``, with the reason), plus what the controller learnt from signals (failures per
node, ``down``), checkpoints and remediations.
"""

from goodput.supervisor.jobstate.model import JobState, NodeRecord, PendingCommand, Refusal
from goodput.supervisor.policy.builtin import (
    REPEAT_FAILURES,
    backend_lacks,
    default_policy,
    evict_straggler,
    replace_node,
    replace_suspects,
    reset_gpus,
    roll_back,
    scale_down,
    scale_up,
    standby_note,
)
from goodput.supervisor.policy.plan import (
    ALLOWED_COMMANDS,
    MAX_COMMANDS,
    Plan,
    PolicyError,
    validate,
)

__all__ = [
    "ALLOWED_COMMANDS",
    "MAX_COMMANDS",
    "REPEAT_FAILURES",
    "JobState",
    "NodeRecord",
    "PendingCommand",
    "Plan",
    "PolicyError",
    "Refusal",
    "backend_lacks",
    "default_policy",
    "evict_straggler",
    "replace_node",
    "replace_suspects",
    "reset_gpus",
    "roll_back",
    "scale_down",
    "scale_up",
    "standby_note",
    "validate",
]
