"""The actuator's pre-launch restore names each node's part: its place in the launch order
(what its ranks' GROUP_RANK is) and the node count; and a node the command counts as failed
(a hot swap's, a scale-down's) has its address withdrawn from the checkpoint index before
any node is asked to restore, so no restore takes it for a live source. A real actuator
process with its local backend and real rank processes; the nodes' replicators are real
command executors on the bus that record what they are asked, and the index as they see it
then, and answer."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, CommandRunner, EmbeddedNats
from goodput.checkpoint.index.index import CheckpointIndex
from goodput.checkpoint.index.records import NodeAddressRecord
from tests.actuator.local_actuator import JOB, RANK_SCRIPT
from tests.processes import stop
from tests.stack.helpers import EventTap

NODES = ["node-0", "node-1", "node-2"]


async def _running(tap: EventTap, attempt: int) -> schemas.JobStatus:
    return await tap.wait_for(
        lambda e: (
            isinstance(e, schemas.JobStatus) and e.attempt == attempt and e.state == "running"
        ),
        what=f"running status of attempt {attempt}",
    )


async def test_each_node_is_asked_for_its_part_of_the_new_membership(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    actuator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "goodput_services.actuator",
            *("--job", JOB, "--nats-url", nats_server.url, "--state-dir", str(tmp_path)),
            *("--set", "restore_timeout_s=20"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "actuator.log", "ab"),  # noqa: SIM115
    )
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()
    asked: list[tuple[str, int | None, int | None]] = []
    index = CheckpointIndex(bus, JOB)
    #: the nodes announced in the index when each restore was asked (its sources)
    announced: list[set[str]] = []
    for port, node in enumerate(NODES, start=7400):  # as each node's replicator does
        await index.announce(NodeAddressRecord(node=node, host="127.0.0.1", port=port, ts=1))

    def replicator(node: str) -> CommandRunner:
        async def execute(command: schemas.Command) -> tuple[bool, str]:
            assert isinstance(command, schemas.RestoreToNode)
            asked.append((command.node, command.part, command.parts))
            announced.append(set((await index.snapshot()).nodes))
            return True, "nothing to restore"

        target = subjects.node_target(subjects.REPLICATOR, node)
        return CommandRunner(bus, job=JOB, target=target, service="replicator", execute=execute)

    runners = [replicator(node) for node in NODES]
    tasks = [asyncio.create_task(runner.run()) for runner in runners]
    try:
        start = schemas.StartJob(
            job=JOB, argv=[sys.executable, "-c", RANK_SCRIPT], nodes=2, procs_per_node=1, spares=1
        )
        await bus.send_command("actuator", start)
        assert (await tap.result_of(start)).ok
        await _running(tap, 1)
        assert asked == []  # a first launch has nothing to restore

        # node-0 fails; the spare takes its place in the launch order, and so its part
        swap = schemas.HotSwap(job=JOB, failed_node="node-0", spare_node="node-2")
        await bus.send_command("actuator", swap)
        assert (await tap.result_of(swap)).ok
        assert (await _running(tap, 2)).active_nodes == ["node-2", "node-1"]
        assert sorted(asked) == [("node-1", 1, 2), ("node-2", 0, 2)]
        assert announced == [{"node-1", "node-2"}] * 2, "node-0 withdrawn before the restores"

        # scale down to one node: it holds part 0 of 1 (its ranks read every part, all staged)
        asked.clear()
        announced.clear()
        scale = schemas.ScaleTo(job=JOB, num_dp_replicas=1, drop_nodes=["node-2"])
        await bus.send_command("actuator", scale)
        assert (await tap.result_of(scale)).ok
        await _running(tap, 3)
        assert asked == [("node-1", 0, 1)]
        assert announced == [{"node-1"}], "the dropped node-2 withdrawn too"
    finally:
        for runner in runners:
            runner.stop()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, 10)
        stop(actuator, timeout_s=90)
        await tap.stop()
        await bus.close()
