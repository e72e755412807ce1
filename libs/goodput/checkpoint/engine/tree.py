"""Split a nested state into its tensors and a JSON skeleton that rebuilds it bit-exactly.

Containers and scalars become tagged JSON nodes (floats as hex so every bit survives);
tensors and numpy arrays become references into a tensor table, whose bytes go to the data
files. Only values of no known kind fall back to pickle, and the skeleton lives in the
manifest, which is checksum-verified before any of it is decoded.
"""

from __future__ import annotations

import base64
import pickle
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class TensorRef:
    """Placeholder for the tensor at ``index`` in the table, used while rebuilding."""

    index: int


@dataclass
class FlatState:
    """A state split into its skeleton (JSON-ready) and the tensors it references."""

    tree: Any
    tensors: list[torch.Tensor]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def flatten(state: Any) -> FlatState:
    """Encode ``state``; tensors are collected in visiting order."""
    tensors: list[torch.Tensor] = []

    def add_tensor(tensor: torch.Tensor) -> int:
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta:
            raise TypeError(f"cannot checkpoint a {tensor.layout} / quantized / meta tensor")
        tensors.append(tensor.detach() if tensor.requires_grad else tensor)
        return len(tensors) - 1

    def encode(value: Any) -> Any:
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int) and type(value) is int:
            if _INT64_MIN <= value <= _INT64_MAX:
                return value
            return {"t": "bigint", "v": str(value)}
        if type(value) is float:
            return {"t": "float", "v": value.hex()}
        if isinstance(value, torch.Tensor):
            return {"t": "tensor", "i": add_tensor(value)}
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufc" and value.dtype.isnative:
            array = np.ascontiguousarray(value)
            return {"t": "ndarray", "i": add_tensor(torch.from_numpy(array))}
        if isinstance(value, np.generic) and value.dtype.kind in "biufc":
            return {"t": "npscalar", "dtype": value.dtype.str, "v": _b64(value.tobytes())}
        if type(value) in (dict, OrderedDict):
            tag = "dict" if type(value) is dict else "odict"
            return {"t": tag, "items": [[encode(k), encode(v)] for k, v in value.items()]}
        if type(value) is list:
            return {"t": "list", "v": [encode(item) for item in value]}
        if type(value) is tuple:
            return {"t": "tuple", "v": [encode(item) for item in value]}
        if isinstance(value, torch.Size):
            return {"t": "size", "v": list(value)}
        if isinstance(value, bytes | bytearray):
            return {"t": type(value).__name__, "v": _b64(bytes(value))}
        if isinstance(value, torch.dtype):
            return {"t": "dtype", "v": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"t": "device", "v": str(value)}
        return {"t": "pickle", "v": _b64(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))}

    tree = encode(state)
    return FlatState(tree=tree, tensors=tensors)


def unflatten(tree: Any, resolve: Any = TensorRef) -> Any:
    """Rebuild a state from its skeleton; ``resolve(index)`` supplies each tensor.

    Call only on a skeleton from a verified manifest: a "pickle" node is unpickled.
    """

    def decode(node: Any) -> Any:
        if node is None or isinstance(node, bool | str | int):
            return node
        tag = node["t"]
        if tag == "float":
            return float.fromhex(node["v"])
        if tag == "bigint":
            return int(node["v"])
        if tag == "tensor":
            return resolve(node["i"])
        if tag == "ndarray":
            tensor = resolve(node["i"])
            return tensor.numpy() if isinstance(tensor, torch.Tensor) else tensor
        if tag == "npscalar":
            return np.frombuffer(_unb64(node["v"]), dtype=np.dtype(node["dtype"]))[0]
        if tag == "dict":
            return {decode(k): decode(v) for k, v in node["items"]}
        if tag == "odict":
            return OrderedDict((decode(k), decode(v)) for k, v in node["items"])
        if tag == "list":
            return [decode(item) for item in node["v"]]
        if tag == "tuple":
            return tuple(decode(item) for item in node["v"])
        if tag == "size":
            return torch.Size(node["v"])
        if tag == "bytes":
            return _unb64(node["v"])
        if tag == "bytearray":
            return bytearray(_unb64(node["v"]))
        if tag == "dtype":
            return getattr(torch, node["v"])
        if tag == "device":
            return torch.device(node["v"])
        if tag == "pickle":
            return pickle.loads(_unb64(node["v"]))
        raise ValueError(f"unknown node tag {tag!r} in checkpoint tree")

    return decode(tree)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in checkpoint")
    return dtype
