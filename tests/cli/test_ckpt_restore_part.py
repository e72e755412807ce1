"""`goodput ckpt restore --part K/N`: what the actuator asks of a node's replicator, by hand;
a malformed or impossible part is refused by the parser in one line, before any bus."""

from __future__ import annotations

import argparse

import pytest

from goodput.tools.cli.ckpt import _part_spec
from tests.conftest import goodput_cli


def test_a_part_is_k_of_n() -> None:
    assert _part_spec("1/3") == (1, 3)
    for bad in ("3/3", "-1/3", "1", "a/b", "1/0"):
        with pytest.raises(argparse.ArgumentTypeError):
            _part_spec(bad)


def test_an_impossible_part_is_one_line_before_any_bus() -> None:
    result = goodput_cli(
        "ckpt",
        "restore",
        "--node",
        "node-0",
        "--part",
        "3/3",
        "--nats-url",
        "nats://127.0.0.1:1",
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith("'3/3': part K of N needs 0 <= K < N")
