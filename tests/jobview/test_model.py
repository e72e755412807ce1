"""The job view folded from hand-built events: no bus, times in seconds after ``BASE``."""

from __future__ import annotations

import pytest
from rich.console import Console

from goodput import schemas
from goodput.measure.accounting import compute_goodput
from goodput.measure.jobview.model import JobModel
from goodput.measure.jobview.render import job_view
from tests.accounting.scenario import EXPECTED_PRODUCTIVE, EXPECTED_TOTAL, scenario_events

JOB = "view"
BASE = 1_800_000_000 * 10**9


def at(seconds: float) -> int:
    return BASE + round(seconds * 1e9)


def status(t: float, state: str, attempt: int, active, spare=(), failed=(), pids=None):
    return schemas.JobStatus(
        job=JOB,
        ts=at(t),
        state=state,  # type: ignore[arg-type]
        attempt=attempt,
        world_size=len(active),
        procs_per_node=1,
        active_nodes=list(active),
        spare_nodes=list(spare),
        failed_nodes=list(failed),
        pids=pids or {},
    )


def started(t: float, node: str, rank: int, pid: int, attempt: int) -> schemas.RankStarted:
    return schemas.RankStarted(
        job=JOB, ts=at(t), node=node, rank=rank, local_rank=0, world_size=2, pid=pid,
        attempt=attempt,
    )  # fmt: skip


def step(t: float, number: int, rank: int = 0, node: str = "node-0") -> schemas.StepDone:
    return schemas.StepDone(
        job=JOB, ts=at(t), node=node, rank=rank, step=number, step_time_s=0.5, tokens=1024,
        loss=2.0, world_size=2,
    )  # fmt: skip


def fold(events, **options) -> JobModel:
    model = JobModel(JOB, **options)
    for event in events:
        model.apply(event)
    return model


def test_step_rate_counts_reference_rank_steps_in_the_window() -> None:
    events = []
    for i in range(61):  # 1 step/s for a minute, on both ranks
        events += [step(i, i + 1), step(i + 0.01, i + 1, rank=1, node="node-1")]
    for i, t in enumerate(range(62, 91, 2)):  # then one step every 2 s
        events.append(step(t, 62 + i))
    model = fold(events, rate_window_s=30)
    view = model.snapshot(at(90)).step
    assert view.step == 76
    assert view.steps_per_s == pytest.approx(0.5)
    assert view.step_time_s == 0.5 and view.tokens_per_s == pytest.approx(2048)
    assert view.last_step_age_s == 0
    stalled = model.snapshot(at(200)).step
    assert stalled.steps_per_s == 0.0 and stalled.last_step_age_s == pytest.approx(110)


def test_last_checkpoint_per_tier_with_its_holders_and_age() -> None:
    def saved(t, number, rank):
        return schemas.CheckpointSaved(
            job=JOB, ts=at(t), node=f"node-{rank}", rank=rank, step=number, stall_s=0.1, bytes=1
        )

    def persisted(t, number, rank):
        return schemas.CheckpointPersisted(
            job=JOB, ts=at(t), node=f"node-{rank}", rank=rank, step=number, path="p", bytes=1,
            duration_s=1.0,
        )  # fmt: skip

    events = [
        saved(1, 5, 0),
        saved(1, 5, 1),
        persisted(2, 5, 0),
        persisted(2, 5, 1),
        schemas.CheckpointBackedUp(
            job=JOB,
            ts=at(4),
            node="node-0",
            step=5,
            uri="gs://b/view/5",
            bytes_uploaded=1,
            bytes_deduplicated=0,
            duration_s=1.0,
        ),
        saved(10, 10, 0),
        saved(10, 10, 1),
        persisted(11, 10, 0),
        persisted(11.5, 10, 1),
        schemas.CheckpointReplicated(
            job=JOB,
            ts=at(12),
            node="node-0",
            peer="node-1",
            step=10,
            bytes_sent=1,
            bytes_deduplicated=0,
            duration_s=0.5,
        ),
        saved(20, 15, 0),  # snapshotted, not yet persisted
        schemas.CheckpointRestored(
            job=JOB, ts=at(21), node="node-2", rank=-1, step=10, tier="peer", duration_s=1
        ),  # a tier filling a volume: not a training restore
    ]
    snap = fold(events).snapshot(at(30))
    tiers = {view.tier: (view.step, view.age_s, view.holders) for view in snap.checkpoints}
    assert tiers == {
        "saved": (15, 10.0, ["node-0/0"]),
        "persisted": (10, 18.5, ["node-0/0", "node-1/1"]),
        "replicated": (10, 18.0, ["node-0→node-1"]),
        "backed_up": (5, 26.0, ["gs://b/view/5"]),
    }
    assert snap.last_restore is None


def test_node_roles_ranks_and_pids_after_a_hot_swap() -> None:
    nodes = ["node-0", "node-1", "node-2"]
    events = [
        status(0, "running", 1, nodes[:2], spare=nodes[2:], pids={"node-0": [100], "node-1": [101]}),
        started(0.1, "node-0", 0, 100, 1),
        started(0.1, "node-1", 1, 101, 1),
        step(1, 1),
        schemas.HostHealth(
            job=JOB, ts=at(2), node="node-1", healthy=False, gpu_available=True, faults=["xid_79"]
        ),
        schemas.Signal(job=JOB, ts=at(2.5), signal="degraded_host", node="node-1",
                       severity="uncorrectable", detail="xid 79"),
        schemas.Decision(job=JOB, ts=at(3), signal_id="s", policy="builtin", rule="hot_swap",
                         reason="node-1 is degraded; node-2 is a spare", command_ids=["c"]),
        schemas.RankExited(job=JOB, ts=at(3.5), node="node-0", rank=0, pid=100, exit_code=-9,
                           attempt=1, expected_reason="restart"),
        schemas.RankExited(job=JOB, ts=at(3.5), node="node-1", rank=1, pid=101, exit_code=-9,
                           attempt=1, expected_reason="restart"),
        started(4, "node-0", 0, 200, 2),
        started(4, "node-2", 1, 201, 2),
        status(4.1, "running", 2, ["node-0", "node-2"], failed=["node-1"],
               pids={"node-0": [200], "node-2": [201]}),
        schemas.Heartbeat(job=JOB, ts=at(5), node="node-2", rank=1, pid=201, step=1, busy="load"),
        schemas.ActionResult(job=JOB, ts=at(5), command_id="c", action="hot_swap", ok=True,
                             duration_s=2.0),
    ]  # fmt: skip
    snap = fold(events, known_nodes=nodes).snapshot(at(6))
    assert (snap.state, snap.attempt, snap.world_size) == ("running", 2, 2)
    by_name = {node.name: node for node in snap.nodes}
    assert [node.name for node in snap.nodes] == ["node-0", "node-2", "node-1"]  # active first
    assert (by_name["node-0"].role, by_name["node-0"].ranks, by_name["node-0"].pids) == (
        "active",
        [0],
        [200],
    )
    assert (by_name["node-2"].role, by_name["node-2"].ranks, by_name["node-2"].pids) == (
        "active",
        [1],
        [201],
    )
    assert by_name["node-2"].last_heard_age_s == 1.0
    assert (by_name["node-1"].role, by_name["node-1"].ranks) == ("failed", [])
    assert by_name["node-1"].host_healthy is False and by_name["node-1"].host_faults == ["xid_79"]
    assert [(r.rank, r.node, r.pid, r.attempt, r.busy) for r in snap.ranks] == [
        (0, "node-0", 200, 2, ""),
        (1, "node-2", 201, 2, "load"),
    ]
    assert snap.events == len(events) - 1  # heartbeats are live only, not counted as stored

    text = _render(snap)
    for name in ("node-0", "node-1", "node-2", "hot_swap", "degraded_host", "failed"):
        assert name in text


def _render(snap) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(job_view(snap))
    return console.export_text()


def test_recent_signals_decisions_and_actions_keep_the_last_n_newest_first() -> None:
    events: list[schemas.Event] = []
    for i in range(5):
        events += [
            schemas.Signal(job=JOB, ts=at(i), signal="crash", node=f"node-{i}", detail=str(i)),
            schemas.Decision(job=JOB, ts=at(i + 0.5), signal_id=str(i), policy="p",
                             rule=f"rule-{i}", reason="r"),
            schemas.ActionResult(job=JOB, ts=at(i + 0.7), command_id=str(i), action="restart",
                                 ok=i != 4, detail="boom" if i == 4 else ""),
        ]  # fmt: skip
    events.append(schemas.Signal(job="another-job", ts=at(9), signal="hang", node="x"))
    snap = fold(events, recent=3).snapshot(at(10))
    assert [s.node for s in snap.signals] == ["node-4", "node-3", "node-2"]
    assert [s.age_s for s in snap.signals] == [6.0, 7.0, 8.0]
    assert [d.rule for d in snap.decisions] == ["rule-4", "rule-3", "rule-2"]
    assert [(a.ok, a.detail) for a in snap.actions] == [(False, "boom"), (True, ""), (True, "")]


def test_running_goodput_matches_the_calculator_and_is_recomputed_only_every_few_seconds() -> None:
    events = scenario_events()
    model = JobModel(events[0].job, goodput_every_s=5)
    assert model.snapshot(at(0)).goodput is None
    assert model.snapshot(at(0)).goodput_note  # says why: no events yet
    half = len(events) // 2
    for event in events[:half]:
        model.apply(event)
    early = model.snapshot(at(100)).goodput
    assert early is not None
    assert early.goodput_pct == pytest.approx(compute_goodput(events[:half]).goodput_pct, abs=0.01)
    for event in events[half:]:
        model.apply(event)
    cached = model.snapshot(at(102)).goodput
    assert cached is not None
    assert cached.goodput_pct == early.goodput_pct and cached.computed_age_s == 2.0
    final = model.snapshot(at(105)).goodput
    assert final is not None and final.computed_age_s == 0
    assert final.goodput_pct == pytest.approx(100 * EXPECTED_PRODUCTIVE / EXPECTED_TOTAL, abs=0.01)
    assert final.productive_s == pytest.approx(EXPECTED_PRODUCTIVE)
    assert final.interruptions == 1
    assert next(iter(final.top_badput)) == "program startup / reinitialization"  # 14 s, largest


def test_an_empty_job_has_a_blank_view() -> None:
    snap = JobModel(JOB, known_nodes=["node-0"]).snapshot(at(0))
    assert snap.state == "unknown" and snap.step.step is None and snap.checkpoints == []
    assert [(n.name, n.role) for n in snap.nodes] == [("node-0", "unknown")]
    assert "node-0" in _render(snap)


def plan(t: float, number: int, dp: int, batch: int, accumulation: int, lr: float, **rescale):
    return schemas.TrainingPlan(
        job=JOB, ts=at(t), node="node-0", rank=0, step=number, world_size=dp, dp_size=dp,
        global_batch=batch, micro_batch=1, accumulation_steps=accumulation, lr=lr, **rescale,
    )  # fmt: skip


def test_the_newest_training_plan_is_shown_with_its_rescale() -> None:
    model = fold(
        [
            plan(0, 0, 2, 12, 6, 0.003),
            plan(50, 40, 1, 6, 6, 0.0015, rescaled_from_dp=2, callbacks=["scale_lr_linear"]),
        ]
    )
    snap = model.snapshot(at(60))
    assert snap.plan is not None
    assert (snap.plan.global_batch, snap.plan.accumulation_steps, snap.plan.lr) == (6, 6, 0.0015)
    assert snap.plan.rescaled_from_dp == 2 and snap.plan.age_s == 10.0
    text = _render(snap)
    assert "6 per step = 1 × 6 accumulation × 1 data-parallel ranks" in text
    assert "from 2 to 1 data-parallel ranks at step 40" in text and "scale_lr_linear" in text


def test_no_plan_reported_shows_none() -> None:
    assert fold([step(1, 1)]).snapshot(at(2)).plan is None


def test_the_last_restore_shows_the_pinned_memory_its_gpu_copies_went_through() -> None:
    restored = schemas.CheckpointRestored(
        job=JOB,
        ts=at(5),
        node="node-1",
        rank=3,
        step=10,
        tier="host",
        duration_s=1,
        pinned_bytes=64 * 2**20,
    )
    snap = fold([restored]).snapshot(at(6))
    assert snap.last_restore is not None and snap.last_restore.pinned_bytes == 64 * 2**20
    assert "from host on node-1, 64 MiB pinned" in _render(snap)
