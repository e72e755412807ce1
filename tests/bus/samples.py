"""One instance of every message schema, with every field set away from its default."""

from __future__ import annotations

from goodput import schemas

JOB = "job-a"


def sample_events() -> list[schemas.Event]:
    return [
        schemas.RankStarted(
            job=JOB, node="n0", rank=1, local_rank=1, world_size=4, pid=10, attempt=2
        ),
        schemas.RankExited(
            job=JOB,
            node="n0",
            rank=1,
            pid=10,
            exit_code=None,
            signal=9,
            attempt=2,
            expected_reason="stop",
        ),
        schemas.Heartbeat(job=JOB, node="n0", rank=1, pid=10, step=5, busy="checkpoint-save"),
        schemas.StepDone(
            job=JOB,
            node="n0",
            rank=1,
            step=5,
            step_time_s=0.12,
            tokens=4096,
            loss=2.75,
            world_size=4,
            compute_time_s=0.1,
        ),
        schemas.CheckpointSaved(job=JOB, node="n0", rank=1, step=5, stall_s=0.01, bytes=1 << 30),
        schemas.CheckpointPersisted(
            job=JOB, node="n0", rank=1, step=5, path="/c/step-5", bytes=1 << 30, duration_s=2.5
        ),
        schemas.CheckpointFailed(job=JOB, node="n0", rank=1, step=5, error="ENOSPC"),
        schemas.CheckpointDropped(job=JOB, node="n0", rank=1, step=5, superseded_by=6),
        schemas.CheckpointReplicated(
            job=JOB,
            node="n0",
            peer="n1",
            step=5,
            bytes_sent=10,
            bytes_deduplicated=20,
            duration_s=1.0,
        ),
        schemas.CheckpointBackedUp(
            job=JOB,
            node="n0",
            step=5,
            uri="gs://b/c",
            bytes_uploaded=10,
            bytes_deduplicated=30,
            duration_s=3.0,
        ),
        schemas.CheckpointRestored(
            job=JOB,
            node="n0",
            rank=1,
            step=5,
            tier="peer",
            duration_s=1.5,
            bytes=99,
            fallbacks=["local: missing"],
        ),
        schemas.TrainingPlan(
            job=JOB,
            node="n0",
            rank=0,
            step=40,
            world_size=2,
            dp_size=2,
            global_batch=12,
            micro_batch=2,
            accumulation_steps=3,
            lr=0.003,
            rescaled_from_dp=1,
            callbacks=["scale_lr_linear", "adjust_schedule"],
        ),
        schemas.HostHealth(
            job=JOB,
            node="n0",
            healthy=False,
            gpu_available=True,
            gpus=[
                schemas.GpuHealth(
                    index=0,
                    uuid="GPU-1",
                    temperature_c=91.0,
                    xid_errors=[79],
                    ecc_uncorrected=2,
                    throttle_reasons=["hw_slowdown"],
                    present=False,
                )
            ],
            disk_free_bytes=1,
            disk_total_bytes=2,
            mem_available_bytes=3,
            mem_total_bytes=4,
            ranks_alive=1,
            ranks_expected=2,
            faults=["gpu_xid"],
            detail="xid 79",
        ),
        schemas.Signal(
            job=JOB,
            signal_id="s1",
            signal="straggler",
            node="n0",
            rank=1,
            severity="uncorrectable",
            detail="1.6x median",
            observed_ts=5,
            host_faults=["gpu_xid:48"],
            gpus=[schemas.GpuHealth(index=1, uuid="GPU-b", xid_errors=[48], ecc_uncorrected=2)],
        ),
        schemas.Decision(
            job=JOB,
            decision_id="d1",
            signal_id="s1",
            policy="builtin",
            rule="evict-straggler",
            reason="slow",
            command_ids=["c1"],
            error="none",
        ),
        schemas.ActionResult(
            job=JOB,
            command_id="c1",
            action="hot_swap",
            ok=True,
            detail="n3 in",
            duration_s=2.0,
            duplicate=True,
        ),
        schemas.GpuReset(
            job=JOB,
            node="n0",
            command_id="c12",
            gpus=[1],
            attempt=3,
            outcome="timed_out",
            duration_s=60.0,
            detail="nvidia-smi did not answer",
        ),
        schemas.JobStatus(
            job=JOB,
            state="running",
            attempt=3,
            world_size=4,
            procs_per_node=2,
            active_nodes=["n0", "n1"],
            spare_nodes=["n2"],
            failed_nodes=["n3"],
            suspect_nodes=["n1"],
            pids={"n0": [11, 12]},
            detail="hot swap",
            run_id="r1",
            capabilities=schemas.BackendCapabilities(
                backend="kubernetes",
                in_process_restart=True,
                standbys="spares",
                gpu_reset=False,
                hot_swap=True,
                scale=True,
            ),
        ),
        schemas.RankRejoined(job=JOB, node="n0", rank=1, pid=7, attempt=3, regroup_s=0.4),
        schemas.RunStarted(
            job=JOB,
            run_id="r1",
            command_id="c1",
            argv=["python", "t.py"],
            nodes=2,
            procs_per_node=2,
        ),
        schemas.ServiceHealth(
            job=JOB,
            service="sensor",
            instance="i",
            pid=1,
            healthy=True,
            started_ts=1,
            period_s=2.0,
            detail="ok",
        ),
        schemas.DeadLetter(
            job=JOB,
            service="sensor",
            subject="gp.job-a.cmd.sensor",
            reason="bad",
            payload=b"\x00\x01",
        ),
    ]


def sample_commands() -> list[schemas.Command]:
    common = {"job": JOB, "decision_id": "d1", "reason": "because"}
    return [
        schemas.CheckpointNow(command_id="c0", **common),
        schemas.Stop(command_id="c1", nodes=["n0"], **common),
        schemas.StartJob(
            command_id="c2",
            argv=["python", "t.py"],
            nodes=2,
            procs_per_node=2,
            spares=1,
            num_nodes_per_dp=1,
            env={"A": "1"},
            workdir="/w",
            **common,
        ),
        schemas.Restart(command_id="c3", nodes=["n0"], reset_gpus={"n0": [1]}, **common),
        schemas.HotSwap(command_id="c4", failed_node="n0", spare_node="n9", **common),
        schemas.ScaleTo(
            command_id="c5", num_dp_replicas=2, nodes=["n1", "n2"], drop_nodes=["n0"], **common
        ),
        schemas.Rescale(command_id="c6", old_world_size=4, new_world_size=2, **common),
        schemas.SetCheckpointInterval(
            command_id="c7", every_steps=50, rationale="Young/Daly", **common
        ),
        schemas.SetThresholds(command_id="c8", values={"heartbeat_timeout_s": 3.0}, **common),
        schemas.InjectFault(
            command_id="c9", node="n0", fault="gpu_xid", detail="79", clear=True, **common
        ),
        schemas.ReturnNode(command_id="c10", node="n0", **common),
        schemas.RestoreToNode(command_id="c11", node="n0", step=40, part=1, parts=3, **common),
        schemas.ResetGpu(
            command_id="c12", node="n0", gpus=[0, 1], attempt=3, run_id="r1", **common
        ),
        schemas.RestartInProcess(command_id="c13", deadline_s=20.0, **common),
        schemas.Rejoin(
            command_id="c14",
            attempt=3,
            master_addr="127.0.0.1",
            master_port=29500,
            world_size=2,
            **common,
        ),
        schemas.LaunchRanks(
            command_id="c15",
            node="n0",
            run_id="r1",
            attempt=2,
            argv=["python", "train.py"],
            workdir="/job",
            ranks=[schemas.RankLaunch(rank=1, local_rank=1, env={"RANK": "1"}, standby=True)],
            **common,
        ),
        schemas.KeepStandbys(
            command_id="c17",
            node="n0",
            run_id="r1",
            count=1,
            argv=["python", "train.py"],
            env={"GOODPUT_JOB": JOB},
            at_once=True,
            **common,
        ),
        schemas.SignalRanks(
            command_id="c16",
            node="n0",
            attempt=2,
            signal="term",
            ranks=[1],
            expected_reason="stop",
            **common,
        ),
    ]
