"""Argument types the bench commands share: one refusal, worded once, for each."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of whole numbers, each at least 1."""
    return [positive_int(part) for part in text.split(",")]


def add_fleet_nodes(
    parser: argparse.ArgumentParser, parse: Callable[[str], list[int]] = positive_ints
) -> None:
    """``--nodes``: the simulated fleet size(s) a fleet-scale bench measures at, one row each
    (``parse`` may refuse sizes that bench cannot simulate)."""
    parser.add_argument(
        "--nodes",
        type=parse,
        default=[512, 2048],
        help="simulated node count(s), comma-separated (default 512,2048)",
    )


def device(text: str) -> str:
    """``cpu`` or ``cuda`` (``cuda:N`` too), refused in one line where there is no GPU
    (torch imported here: a bench without a device need not load it)."""
    import torch

    if text != "cpu" and text.split(":")[0] != "cuda":
        raise argparse.ArgumentTypeError(f"expected cpu or cuda, not {text!r}")
    if text != "cpu" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"{text}: CUDA is not available here (torch {torch.__version__})"
        )
    return text
