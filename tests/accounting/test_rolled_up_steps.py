"""`goodput report` on a run whose steps its nodes rolled up (issue 36): the same figures as
on the same steps published by every rank, from a list and replayed from a real server."""

from __future__ import annotations

import msgspec
import pytest

from goodput import schemas
from goodput.bus import Bus
from goodput.measure.accounting import compute_goodput, replay_from_bus
from tests.accounting.scenario import EXPECTED_BADPUT, EXPECTED_TOTAL, JOB, scenario_events
from tests.rollups import steps_rolled_up


def _on_one_node(events: list[schemas.Event]) -> list[schemas.Event]:
    """The scenario with both ranks on node n0: one rollup holds both ranks' steps."""
    return [
        msgspec.structs.replace(e, node="n0") if isinstance(e, schemas.StepDone) else e
        for e in events
    ]


@pytest.mark.parametrize("placement", ["a rank per node", "two ranks on a node"])
def test_rolled_up_steps_give_the_same_report(placement: str) -> None:
    per_rank = scenario_events()
    if placement == "two ranks on a node":
        per_rank = _on_one_node(per_rank)
    rolled = steps_rolled_up(per_rank)
    assert not any(isinstance(e, schemas.StepDone) for e in rolled)
    rollups = [e for e in rolled if isinstance(e, schemas.StepsDone)]
    steps = sum(isinstance(e, schemas.StepDone) for e in per_rank)
    if placement == "two ranks on a node":  # one event per step while both ranks run
        assert len(rollups) < steps and max(len(e.steps) for e in rollups) == 2
    report = compute_goodput(rolled)
    assert report == compute_goodput(per_rank)
    assert report.badput == pytest.approx(EXPECTED_BADPUT)
    assert report.total_s == pytest.approx(EXPECTED_TOTAL)


async def test_a_replay_of_rolled_up_steps_from_the_bus_reports_the_same(bus: Bus) -> None:
    per_rank = _on_one_node(scenario_events())
    rolled = steps_rolled_up(per_rank)
    await bus.emit_many(rolled)
    replayed = await replay_from_bus(bus, JOB)
    assert replayed == rolled  # the wire's shape, as stored
    assert compute_goodput(replayed) == compute_goodput(per_rank)
