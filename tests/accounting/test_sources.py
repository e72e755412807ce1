"""Reading and writing event logs, including the broken ones."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from goodput import schemas
from goodput.measure.accounting import (
    EventLogError,
    compute_goodput,
    load_event_log,
    write_event_log,
)
from tests.accounting.scenario import EXPECTED_TOTAL, scenario_events


def test_export_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = scenario_events()
    assert write_event_log(path, events) == len(events)
    first = msgspec.json.decode(path.read_bytes().splitlines()[0])
    assert first["kind"] == "rank_started"
    loaded = load_event_log(path)
    assert loaded == events
    assert compute_goodput(loaded).total_s == pytest.approx(EXPECTED_TOTAL)
    assert not list(tmp_path.glob("*.tmp"))


def test_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_event_log(path, scenario_events())
    data = path.read_bytes()
    path.write_bytes(data + data.splitlines()[5][:17])  # a writer killed mid-line
    count = len(data.splitlines())
    with pytest.raises(EventLogError, match=rf"events\.jsonl:{count + 1}"):
        load_event_log(path)
    assert len(load_event_log(path, strict=False)) == count


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"kind": "no_such_kind", "job": "j"}', "no_such_kind"),
        (b'{"kind": "step", "job": "j", "node": "n", "rank": 0}', "missing required field"),
        (
            b'{"kind": "heartbeat", "job": "j", "node": "n", "rank": 0, "pid": 1, "step": 1, "x": 1}',
            "unknown field",
        ),
    ],
)
def test_invalid_events_are_named(tmp_path: Path, line: bytes, reason: str) -> None:
    path = tmp_path / "events.jsonl"
    good = msgspec.json.encode(scenario_events()[0])
    path.write_bytes(good + b"\n\n" + line + b"\n")
    with pytest.raises(EventLogError, match=reason):
        load_event_log(path)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    event = msgspec.structs.replace(scenario_events()[0], schema=schemas.SCHEMA_VERSION + 1)
    path = tmp_path / "events.jsonl"
    path.write_bytes(msgspec.json.encode(event) + b"\n")
    with pytest.raises(EventLogError, match="newer"):
        load_event_log(path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "no events"),
        (b"\n  \n", "no events"),
        (b"not json at all\n", "not JSON lines"),
        (b'{"hello": 1}\n', "neither goodput events"),
        (b"[1, 2]\n", "neither goodput events"),
    ],
)
def test_unreadable_logs(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(content)
    with pytest.raises(EventLogError, match=reason):
        load_event_log(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(EventLogError, match="cannot read"):
        load_event_log(tmp_path / "absent.jsonl")
