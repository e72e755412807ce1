"""State builders and a bit-exact comparison shared by the checkpoint tests."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

import numpy as np
import torch


def make_state(seed: int, *, scale: int = 1) -> dict[str, Any]:
    """A training-like state: model + Adam + RNG states + plain values, all from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    model = OrderedDict(
        (f"layer{i}.weight", torch.randn(64 * scale, 32, generator=generator)) for i in range(4)
    )
    model["layer0.bias"] = torch.randn(64 * scale, generator=generator).to(torch.bfloat16)
    optim_state = {
        i: {
            "step": torch.tensor(float(seed)),
            "exp_avg": torch.randn(64 * scale, 32, generator=generator),
            "exp_avg_sq": torch.rand(64 * scale, 32, generator=generator),
        }
        for i in range(4)
    }
    rng = np.random.RandomState(seed)
    return {
        "model": model,
        "optim": {
            "state": optim_state,
            "param_groups": [
                {"lr": 1e-3 * (seed + 1), "betas": (0.9, 0.999), "params": [0, 1, 2, 3]}
            ],
        },
        "step": seed,
        "torch_rng": torch.Generator().manual_seed(seed).get_state(),
        "numpy_rng": rng.get_state(),
        "python_rng": random.Random(seed).getstate(),
        "mask": torch.rand(17, generator=generator) > 0.5,
        "ids": np.arange(seed, seed + 9, dtype=np.int64),
        "note": f"seed {seed}",
        "blob": bytes(range(seed % 7, 40)),
        "empty": torch.empty(0, 3),
        "nan": float("nan"),
        "neg_zero": -0.0,
    }


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().contiguous().reshape(-1)
    return flat if flat.dtype in (torch.bool, torch.uint8) else flat.view(torch.uint8)


def assert_bit_exact(expected: Any, actual: Any, path: str = "state") -> None:
    """Same structure, types, dtypes, shapes and bytes (NaN equals NaN)."""
    assert type(expected) is type(actual), f"{path}: {type(expected)} != {type(actual)}"
    if isinstance(expected, torch.Tensor):
        assert expected.dtype == actual.dtype and expected.shape == actual.shape, path
        assert torch.equal(_bits(expected), _bits(actual)), f"{path}: bytes differ"
    elif isinstance(expected, np.ndarray):
        assert expected.dtype == actual.dtype and expected.tobytes() == actual.tobytes(), path
    elif isinstance(expected, dict):
        assert list(expected) == list(actual), f"{path}: keys differ"
        for key in expected:
            assert_bit_exact(expected[key], actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(expected) == len(actual), f"{path}: lengths differ"
        for index, (a, b) in enumerate(zip(expected, actual, strict=True)):
            assert_bit_exact(a, b, f"{path}[{index}]")
    elif isinstance(expected, float):
        assert expected.hex() == actual.hex() or (expected != expected and actual != actual), path
    else:
        assert expected == actual, f"{path}: {expected!r} != {actual!r}"
