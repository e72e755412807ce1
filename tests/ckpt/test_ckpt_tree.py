"""The state skeleton: every supported plain value survives bit-exactly, unknowns via pickle."""

from __future__ import annotations

import json
from collections import OrderedDict
from fractions import Fraction

import numpy as np
import torch

from goodput.checkpoint.engine.tree import flatten, unflatten

from .helpers import assert_bit_exact


def test_plain_values_round_trip_through_json() -> None:
    state = {
        1: "int key",
        (2, "b"): ["tuple key", None, True, False],
        "floats": [0.1, -0.0, float("inf"), 1e-310],
        "big": 2**100,
        "bytes": b"\x00\xff",
        "bytearray": bytearray(b"ab"),
        "ordered": OrderedDict([("z", 1), ("a", 2)]),
        "size": torch.Size([3, 4]),
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "np_scalar": np.float32(1.25),
        "np_array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "tensor": torch.arange(4),
    }
    flat = flatten(state)
    tree = json.loads(json.dumps(flat.tree))
    restored = unflatten(tree, lambda i: flat.tensors[i].clone())
    restored["np_array"] = np.asarray(restored["np_array"])
    assert_bit_exact(state, restored)
    assert len(flat.tensors) == 2


def test_unknown_objects_fall_back_to_pickle() -> None:
    flat = flatten({"fraction": Fraction(1, 3)})
    assert flat.tree["items"][0][1]["t"] == "pickle"
    assert unflatten(flat.tree) == {"fraction": Fraction(1, 3)}
