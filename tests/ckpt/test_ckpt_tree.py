"""The state skeleton: every supported plain value survives bit-exactly; anything else is
refused at save, and a node of no known kind (a forged pickle) is never decoded."""

from __future__ import annotations

import base64
import json
import os
import pickle
import random
from collections import OrderedDict
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from goodput.checkpoint.engine.tree import TreeError, UnsupportedValueError, flatten, unflatten

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
    restored = unflatten(tree, lambda i: flat.tensors[i].clone(), tensor_count=2)
    restored["np_array"] = np.asarray(restored["np_array"])
    assert_bit_exact(state, restored)
    assert len(flat.tensors) == 2


def test_a_value_of_no_known_kind_is_refused_at_save_naming_its_path() -> None:
    state = {"model": {"w": torch.ones(2)}, "optim": {"state": [1, {"foo": Fraction(1, 3)}]}}
    with pytest.raises(UnsupportedValueError) as caught:
        flatten(state)
    message = str(caught.value)
    assert message.startswith("cannot checkpoint state['optim']['state'][1]['foo']: ")
    assert "fractions.Fraction" in message and "state_dict()" in message and "\n" not in message
    with pytest.raises(UnsupportedValueError, match=r"state\['g'\]: a torch\._C\.Generator"):
        flatten({"g": torch.Generator()})
    with pytest.raises(UnsupportedValueError, match=r"state\[Fraction\(1, 2\)\] \(the key\)"):
        flatten({Fraction(1, 2): 0})


def test_rng_states_are_plain_data() -> None:
    """What training loops save for reproducibility needs no pickle."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "numpy_gen": np.random.default_rng(3).bit_generator.state,
        "torch": torch.get_rng_state(),
    }
    flat = flatten(state)
    restored = unflatten(
        json.loads(json.dumps(flat.tree)), lambda i: flat.tensors[i], tensor_count=len(flat.tensors)
    )
    random.setstate(restored["python"])
    np.random.set_state(restored["numpy"])
    assert torch.equal(restored["torch"], state["torch"])


def test_a_forged_pickle_node_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = base64.b64encode(pickle.dumps(_Exploit(str(marker)))).decode()
    for node in (
        {"t": "pickle", "v": payload},
        {"t": "dtype", "v": "load"},  # torch.load, not a dtype
        {"t": "npscalar", "dtype": "O", "v": "AA=="},
        {"t": "tensor", "i": 5},
        {"t": "list"},
    ):
        with pytest.raises(TreeError):
            unflatten({"t": "dict", "items": [["x", node]]}, tensor_count=1)
    assert not marker.exists()


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.path}",))
