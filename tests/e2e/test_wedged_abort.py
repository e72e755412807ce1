"""A survivor whose process group cannot be aborted, on the real stack: the example job with
two ranks, rank 1 killed, rank 0's group abort wedged. The in-process restart the controller
decides fails with rank 0's reason, rank 0 never joins the new rendezvous, and the cold restart
that follows is decided with that reason.

The wedge is ``WedgedAbort``, a FAKE put in place of torch's ``_abort_process_group`` in
rank 0 only: an abort that never returns, as ``ncclCommAbort`` does on a communicator whose
kernel or proxy thread is wedged (which needs GPUs to happen for real). Before the abort was
bounded, rank 0 hung in it and the actuator could only say it did not rejoin in time."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from goodput import schemas
from goodput.launch.rank_env import knobs
from tests.examples.launch import TINY_MODEL_ARGS
from tests.stack.helpers import job_on_stack, remediation

pytestmark = pytest.mark.slow  # two torch processes start, twice: minutes on a loaded machine
JOB = "job-wedged"
WAIT_S = 600.0

WEDGED_RANK = (
    "import os, runpy, sys, threading\n"
    "import torch.distributed.distributed_c10d as c10d\n"
    "class WedgedAbort:\n"
    "    '''FAKE: a process group abort that never returns (a wedged NCCL communicator).'''\n"
    "    def __call__(self, group=None):\n"
    "        print('group abort wedged', flush=True)\n"
    "        threading.Event().wait()\n"
    "if os.environ['RANK'] == '0':\n"
    "    c10d._abort_process_group = WedgedAbort()  # before goodput takes torch's abort\n"
    "sys.argv = ['supervised', *sys.argv[1:]]\n"
    "runpy.run_module('goodput.examples.gpt.supervised', run_name='__main__')\n"
)


async def test_a_survivor_whose_abort_hangs_fails_the_warm_restart_and_cold_follows(
    tmp_path: Path,
) -> None:
    start = schemas.StartJob(
        job=JOB,
        argv=[sys.executable, "-c", WEDGED_RANK, "--steps", "100000", *TINY_MODEL_ARGS],
        nodes=2,
        procs_per_node=1,
        spares=0,
        env=knobs(ckpt_every=5),
    )
    async with job_on_stack(tmp_path / "stack", JOB, 2, start) as (_, tap):
        await tap.wait_for(
            lambda e: isinstance(e, schemas.StepDone) and e.rank == 1 and e.step >= 6, WAIT_S
        )
        # the attempt training now (on a loaded machine a slow start can be restarted first)
        running = [e for e in tap.of(schemas.JobStatus) if e.state == "running"][-1]
        killed_ts = schemas.now_ns()
        os.kill(running.pids["node-1"][0], signal.SIGKILL)

        # the controller's checkpoint-interval tuning is a decision too, and may come between
        warm = await tap.wait_for(
            lambda e: remediation(e) and e.ts > killed_ts, WAIT_S, "a remediation"
        )
        assert warm.rule == "in-process-restart", warm
        refused = await tap.wait_for(
            lambda e: isinstance(e, schemas.ActionResult) and e.command_id in warm.command_ids,
            WAIT_S,
            "the in-process restart's result",
        )
        assert not refused.ok
        why = "rank 0 cannot: its process group abort did not return within 10 s"
        assert why in refused.detail, refused.detail
        # rank 0 answered instead of joining: nothing of attempt 2 rejoined
        assert not [e for e in tap.of(schemas.RankRejoined) if e.ok]

        cold = await tap.wait_for(lambda e: remediation(e) and e.ts > warm.ts, WAIT_S, "the next")
        assert cold.rule == "in-job-restart", cold
        assert why in cold.reason, cold.reason
        await tap.wait_for(
            lambda e: (
                isinstance(e, schemas.JobStatus)
                and e.attempt == running.attempt + 2  # the failed warm attempt, then the cold one
                and e.state == "running"
            ),
            WAIT_S,
            "the cold restart running",
        )
