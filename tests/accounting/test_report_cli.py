"""`goodput report` on bad input: one line naming what is wrong, a non-zero exit, no traceback.

User text (paths, job names, exception messages) must never be read as rich markup.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from goodput import schemas
from tests.conftest import goodput_cli, refused_in_one_line

BASE = 1_700_000_000 * 10**9
#: the command imports every subcommand; on a loaded host that alone can take a minute
CLI_TIMEOUT_S = 600


def step_line(**fields: object) -> bytes:
    """A StepDone as JSON, with ``fields`` replacing any of its values (even invalid ones)."""
    event = schemas.StepDone(
        job="j", ts=BASE, node="n", rank=0, step=1, step_time_s=1.0, tokens=1, loss=1.0
    )
    return msgspec.json.encode({**msgspec.to_builtins(event), "kind": "step", **fields}) + b"\n"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"ts": 2**64}, "$.ts"),  # was an OverflowError
        ({"ts": 2**63}, "$.ts"),
        ({"ts": -5}, "$.ts"),  # was accepted: a 55-year window
        ({"step_time_s": -1.0}, "$.step_time_s"),
        ({"step_time_s": 1e300}, "$.step_time_s"),  # was an OverflowError (infinity)
    ],
)
def test_out_of_range_fields_name_the_line(
    tmp_path: Path, fields: dict[str, object], reason: str
) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(step_line() + step_line(**fields))
    result = goodput_cli("report", "--events", str(log), check=False, timeout=CLI_TIMEOUT_S)
    refused_in_one_line(result, f"{log}:2:", reason, code=1)


def test_markup_in_a_path_is_printed_as_is(tmp_path: Path) -> None:
    directory = tmp_path / "run["
    directory.mkdir()
    log = directory / "x].jsonl"  # the path reads run[/x].jsonl: a closing tag for rich
    log.write_bytes(b"not json\n")
    result = goodput_cli("report", "--events", str(log), check=False, timeout=CLI_TIMEOUT_S)
    refused_in_one_line(result, f"{log}:1:", code=1)


def test_markup_in_a_job_name_is_refused_and_printed_as_is(tmp_path: Path) -> None:
    """A job is a subject token, so a name with markup (which once had to be printed as it
    is) cannot come off the bus: an events file holding one is refused in one line, and the
    markup in that line (the file's own path) is printed as it is, not interpreted."""
    log = tmp_path / "ev[bold]ents.jsonl"
    log.write_bytes(step_line(job="j[/red]") + step_line(job="j[/red]", ts=BASE + 10**9, step=2))
    result = goodput_cli("report", "--events", str(log), check=False, timeout=CLI_TIMEOUT_S)
    refused_in_one_line(result, f"{log}:1", "$.job", code=1)
