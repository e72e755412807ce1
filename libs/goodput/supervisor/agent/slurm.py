"""What a node agent reads from Slurm's environment: pure, so the parsing is tested alone.

``srun --ntasks-per-node=1 goodput agent`` runs one agent per node of the allocation; each
takes its node name from ``SLURMD_NODENAME`` (the name Slurm knows the host by) and checks it
against the allocation (``SLURM_JOB_NODELIST``, in Slurm's compressed form
``gpu[001-003,007],cpu1``). ``goodput run`` on the batch host reads the node count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec


class SlurmEnvError(ValueError):
    """A Slurm variable that does not parse; the message names it."""


class SlurmJob(msgspec.Struct, kw_only=True, frozen=True):
    job_id: str
    #: this host's name in the allocation ("" outside a job step)
    node: str
    #: this host's index in the allocation (SLURM_NODEID)
    node_index: int
    nodes: list[str]
    #: GPUs Slurm gave this node (None: Slurm did not say)
    gpus_on_node: int | None = None


def expand_nodelist(nodelist: str) -> list[str]:
    """``gpu[001-003,007],cpu1`` → ``gpu001 gpu002 gpu003 gpu007 cpu1`` (zero padding kept;
    several bracketed ranges in one name multiply out, as Slurm's ``hostlist`` does)."""
    names: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        if item:
            names += _expand_one(item)
    return names


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise SlurmEnvError(f"SLURM_JOB_NODELIST={text!r}: unbalanced ']'")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SlurmEnvError(f"SLURM_JOB_NODELIST={text!r}: unbalanced '['")
    parts.append("".join(current))
    return parts


_BRACKET = re.compile(r"\[([^\]]*)\]")


def _expand_one(item: str) -> list[str]:
    match = _BRACKET.search(item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    expanded: list[str] = []
    for part in match.group(1).split(","):
        bounds = part.split("-")
        if len(bounds) == 1 and bounds[0].isdigit():
            values = [bounds[0]]
        elif len(bounds) == 2 and all(b.isdigit() for b in bounds):
            low, high = int(bounds[0]), int(bounds[1])
            if high < low:
                raise SlurmEnvError(f"node range {part!r} in {item!r} runs backwards")
            width = len(bounds[0])
            values = [str(n).zfill(width) for n in range(low, high + 1)]
        else:
            raise SlurmEnvError(f"node range {part!r} in {item!r} is not N or N-M")
        expanded += [head + value for value in values]
    return [name for prefix in expanded for name in _expand_one(prefix + tail)]


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    # SLURM_GPUS_ON_NODE is a count; older Slurm wrote e.g. "gpu:4" in related variables
    digits = raw.rsplit(":", 1)[-1]
    if not digits.isdigit():
        raise SlurmEnvError(f"{name}={raw!r} is not a count")
    return int(digits)


def read_slurm(env: Mapping[str, str]) -> SlurmJob | None:
    """The Slurm job this process runs in (None outside Slurm: no SLURM_JOB_ID)."""
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    nodes = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    count = _int(env, "SLURM_NNODES") or _int(env, "SLURM_JOB_NUM_NODES")
    if count is not None and nodes and count != len(nodes):
        raise SlurmEnvError(
            f"SLURM_NNODES={count} but SLURM_JOB_NODELIST names {len(nodes)} node(s)"
        )
    index = _int(env, "SLURM_NODEID")
    node = env.get("SLURMD_NODENAME", "")
    if not node and index is not None and index < len(nodes):
        node = nodes[index]
    if node and nodes and node not in nodes:
        raise SlurmEnvError(f"SLURMD_NODENAME={node!r} is not in SLURM_JOB_NODELIST")
    if index is None:
        index = nodes.index(node) if node in nodes else 0
    return SlurmJob(
        job_id=job_id,
        node=node,
        node_index=index,
        nodes=nodes,
        gpus_on_node=_int(env, "SLURM_GPUS_ON_NODE"),
    )


def agent_node_name(env: Mapping[str, str]) -> str:
    """The node name an agent started by ``srun`` takes ("" outside a Slurm job step): the
    host's Slurm name, made a subject token (Slurm allows dots, NATS tokens do not)."""
    job = read_slurm(env)
    if job is None or not job.node:
        return ""
    return re.sub(r"[^A-Za-z0-9_-]", "-", job.node)
