"""`goodput bench step-send` (issue 36): a step report handed to a real aggregator process
over the node's channel, timed against the link's queue."""

from __future__ import annotations

import json

import pytest

from goodput.tools.cli.main import main


def test_every_report_is_delivered_and_rolled_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "step-send", "--reports", "40", "--every-ms", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["delivered"] == 40 and report["refused"] == 0
    # the sender's reports and the aggregating rank's own, one rollup per step
    assert report["reports_rolled_up"] == 80 and report["rollups"] == 40
    for name in ("queue_put", "datagram"):
        figures = report[name]
        assert 0 < figures["median_us"] <= figures["p99_us"] <= figures["max_us"]
