"""Split a nested state into its tensors and a JSON skeleton that rebuilds it bit-exactly.

Containers and scalars become tagged JSON nodes (floats as hex so every bit survives);
tensors and numpy arrays become references into a tensor table, whose bytes go to the data
files. A checkpoint is data: there is no pickle, so restoring one runs no code. A value of no
known kind is refused when it is saved, naming where it sits in the state; a node of no
known kind on restore (an old or forged "pickle" node among them) makes the checkpoint
corrupt, and restore falls back to an older one.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from goodput.checkpoint.format.tensor_layout import DTYPE_ITEMSIZE

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: the torch dtypes a checkpoint may hold: those of the format's layout table this torch has
_DTYPES = frozenset(
    dtype for name in DTYPE_ITEMSIZE if isinstance(dtype := getattr(torch, name, None), torch.dtype)
)
_PLAIN_KINDS = "None, bool, int, float, str, bytes, or a list, tuple or dict of them"


class UnsupportedValueError(TypeError):
    """A state value that a checkpoint cannot hold as data (raised at save)."""


class TreeError(ValueError):
    """A skeleton that does not decode: damaged, forged, or of a kind this reader refuses."""


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


class _Refused(Exception):
    """Raised where a value is refused; each container on the way up adds its key, so the
    path costs nothing unless a save is refused."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []

    def error(self) -> UnsupportedValueError:
        where = "state" + "".join(reversed(self.path))
        return UnsupportedValueError(f"cannot checkpoint {where}: {self.problem}")


def _unsupported(value: Any) -> _Refused:
    kind = type(value)
    return _Refused(
        f"a {kind.__module__}.{kind.__qualname__} is neither a tensor nor a plain value"
        f" ({_PLAIN_KINDS}); save its state instead: a tensor (e.g. generator.get_state())"
        " or plain values (e.g. obj.state_dict(), enum.value)"
    )


def flatten(state: Any) -> FlatState:
    """Encode ``state``; tensors are collected in visiting order. Raises
    UnsupportedValueError (one line, naming the value's path) for a value of no known kind."""
    tensors: list[torch.Tensor] = []

    def add_tensor(tensor: torch.Tensor) -> int:
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta:
            raise _Refused(f"a {tensor.layout} / quantized / meta tensor")
        if tensor.dtype not in _DTYPES:
            raise _Refused(f"a tensor of dtype {tensor.dtype}")
        tensors.append(tensor.detach() if tensor.requires_grad else tensor)
        return len(tensors) - 1

    def within(key: Any, value: Any, *, is_key: bool = False) -> Any:
        try:
            return encode(value)
        except _Refused as refused:
            refused.path.append(f"[{key!r}]" + (" (the key)" if is_key else ""))
            raise

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
            items = [[within(k, k, is_key=True), within(k, v)] for k, v in value.items()]
            return {"t": tag, "items": items}
        if type(value) in (list, tuple):
            tag = type(value).__name__
            return {"t": tag, "v": [within(i, item) for i, item in enumerate(value)]}
        if isinstance(value, torch.Size):
            return {"t": "size", "v": list(value)}
        if isinstance(value, bytes | bytearray):
            return {"t": type(value).__name__, "v": _b64(bytes(value))}
        if isinstance(value, torch.dtype):
            return {"t": "dtype", "v": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"t": "device", "v": str(value)}
        raise _unsupported(value)

    try:
        tree = encode(state)
    except _Refused as refused:
        raise refused.error() from None
    return FlatState(tree=tree, tensors=tensors)


def unflatten(tree: Any, resolve: Any = TensorRef, *, tensor_count: int) -> Any:
    """Rebuild a state from its skeleton; ``resolve(index)`` supplies each of the
    ``tensor_count`` tensors. Raises TreeError for a node of no known kind or malformed."""

    def tensor(node: dict[str, Any]) -> Any:
        index = node["i"]
        if type(index) is not int or not 0 <= index < tensor_count:
            raise TreeError(f"tensor reference {index!r} outside the {tensor_count} tensors")
        return resolve(index)

    def npscalar(node: dict[str, Any]) -> Any:
        dtype = np.dtype(node["dtype"])
        if dtype.kind not in "biufc":
            raise TreeError(f"numpy scalar of dtype {dtype} in checkpoint tree")
        return np.frombuffer(_unb64(node["v"]), dtype=dtype)[0]

    def decode(node: Any) -> Any:
        if node is None or isinstance(node, bool | str | int):
            return node
        tag = node["t"]
        if tag == "float":
            return float.fromhex(node["v"])
        if tag == "bigint":
            return int(node["v"])
        if tag == "tensor":
            return tensor(node)
        if tag == "ndarray":
            value = tensor(node)
            return value.numpy() if isinstance(value, torch.Tensor) else value
        if tag == "npscalar":
            return npscalar(node)
        if tag == "dict":
            return {decode(k): decode(v) for k, v in node["items"]}
        if tag == "odict":
            return OrderedDict((decode(k), decode(v)) for k, v in node["items"])
        if tag == "list":
            return [decode(item) for item in node["v"]]
        if tag == "tuple":
            return tuple(decode(item) for item in node["v"])
        if tag == "size":
            return torch.Size(int(dim) for dim in node["v"])
        if tag == "bytes":
            return _unb64(node["v"])
        if tag == "bytearray":
            return bytearray(_unb64(node["v"]))
        if tag == "dtype":
            return dtype_from_name(node["v"])
        if tag == "device":
            return torch.device(node["v"])
        raise TreeError(f"node of unknown kind {tag!r} in checkpoint tree")

    try:
        return decode(tree)
    except TreeError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, binascii.Error) as exc:
        raise TreeError(f"malformed checkpoint tree ({type(exc).__name__}: {exc})") from exc


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype a checkpoint names; TreeError for one no checkpoint may hold."""
    dtype = getattr(torch, name, None) if name in DTYPE_ITEMSIZE else None
    if dtype not in _DTYPES:
        raise TreeError(f"unknown dtype {name!r} in checkpoint")
    return dtype
