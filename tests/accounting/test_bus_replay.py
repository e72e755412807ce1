"""Replaying a job's events from GP_EVENTS on a real nats-server, and `goodput report` on it."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, EmbeddedNats
from goodput.measure.accounting import load_event_log, replay_from_bus
from goodput.tools.cli.main import main
from tests.accounting.scenario import EXPECTED_BADPUT, EXPECTED_TOTAL, JOB, scenario_events
from tests.conftest import goodput_cli


async def test_replay_returns_exactly_the_jobs_events_in_order(bus: Bus) -> None:
    events = scenario_events()
    others = [msgspec.structs.replace(e, job="other-job") for e in events[:10]]
    await bus.emit_many(others[:5] + events + others[5:])
    seen: list[tuple[int, int]] = []
    replayed = await replay_from_bus(
        bus, JOB, progress=lambda done, total: seen.append((done, total))
    )
    assert replayed == events
    assert seen[-1] == (len(events), len(events))
    assert await replay_from_bus(bus, "other-job") == others


async def test_replay_of_an_unknown_job_is_empty(bus: Bus) -> None:
    assert await replay_from_bus(bus, "nobody") == []
    with pytest.raises(ValueError, match="invalid job name"):
        await replay_from_bus(bus, "bad.job")


async def test_history_stored_before_ranks_were_named_replays_the_same(bus: Bus) -> None:
    """Steps and checkpoints stored on their kind's subject without the rank (before issue 36)
    still replay, beside those with it, in order: a report over an older run is unchanged."""
    events = scenario_events()
    half = len(events) // 2
    for event in events[:half]:  # as the build before published them
        kind = schemas.kind_of(type(event))
        await bus.js.publish(subjects.event(event.job, kind), schemas.encode(event))
    await bus.emit_many(events[half:])
    ranked = [e for e in events[:half] if isinstance(e, subjects.RANKED_EVENTS)]
    assert ranked, "the scenario's first half has steps or checkpoints"
    assert await replay_from_bus(bus, JOB) == events


async def test_undecodable_messages_are_skipped(bus: Bus) -> None:
    events = scenario_events()[:4]
    await bus.emit_many(events[:2])
    await bus.js.publish(subjects.event(JOB, "step"), b"\x00 not msgpack")
    await bus.emit_many(events[2:])
    assert await replay_from_bus(bus, JOB) == events


async def test_long_replay(bus: Bus) -> None:
    steps = [
        schemas.StepDone(
            job=JOB,
            ts=10**18 + i * 10**9,
            node="n0",
            rank=0,
            step=i,
            step_time_s=1.0,
            tokens=1,
            loss=1.0,
        )
        for i in range(1, 3001)
    ]
    await bus.emit_many(steps)
    replayed = await replay_from_bus(bus, JOB)
    assert [e.step for e in replayed] == list(range(1, 3001))  # type: ignore[attr-defined]


async def test_cli_reports_and_exports_from_the_bus(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    events = scenario_events()
    await bus.emit_many(events)
    export = tmp_path / "export.jsonl"
    result = goodput_cli(
        "report",
        "--job",
        JOB,
        "--state-dir",
        str(nats_server.paths.root),
        "--export",
        str(export),
        "--json",
    )
    report = json.loads(result.stdout)
    assert report["total_s"] == pytest.approx(EXPECTED_TOTAL)
    assert report["badput"] == pytest.approx(EXPECTED_BADPUT)
    assert load_event_log(export) == events
    # the same through an explicit URL, as a table
    table = goodput_cli("report", "--job", JOB, "--nats-url", nats_server.url)
    assert "goodput" in table.stdout and "restart / reprovision" in table.stdout


def test_cli_without_a_bus_says_how_to_get_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GOODPUT_NATS_URL", raising=False)
    assert main(["report", "--job", JOB, "--state-dir", str(tmp_path)]) == 1
    assert "no bus" in capsys.readouterr().err


def test_cli_on_a_job_without_events(
    nats_server: EmbeddedNats, capsys: pytest.CaptureFixture[str]
) -> None:
    # a server nobody provisioned holds no stream at all: still "no events", not a traceback
    assert main(["report", "--job", "empty", "--nats-url", nats_server.url]) == 1
    assert "no events of job 'empty'" in capsys.readouterr().err
