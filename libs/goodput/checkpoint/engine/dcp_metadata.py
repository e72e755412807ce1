"""DCP's ``.metadata`` read as data: a pickle, unpickled with only DCP's metadata types.

torch.distributed.checkpoint writes its metadata with ``pickle`` and its FileSystemReader
reads it back with a plain ``pickle.load``, which runs whatever code a forged file names.
The goodput reader checks the file against its digest in the manifest first (with the job's
key, a digest only the job could have sealed), and reads it with this unpickler, which
resolves nothing but the types DCP's metadata is made of: its metadata dataclasses, the
filesystem's storage info, ``torch.Size``, the dtypes a checkpoint may hold, torch's layout
lookup, and ``pathlib`` paths. Anything else is a corrupt checkpoint.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
import torch.distributed.checkpoint.filesystem as dcp_filesystem
import torch.distributed.checkpoint.metadata as dcp_metadata

from goodput.checkpoint.engine.fileio import CorruptCheckpointError
from goodput.checkpoint.format.tensor_layout import DTYPE_ITEMSIZE

_ALLOWED: dict[tuple[str, str], Any] = {
    **{
        (dcp_metadata.__name__, name): value
        for name, value in vars(dcp_metadata).items()
        if isinstance(value, type) and value.__module__ == dcp_metadata.__name__
    },
    (dcp_filesystem.__name__, "_StorageInfo"): dcp_filesystem._StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("pathlib", "PosixPath"): __import__("pathlib").PosixPath,
    ("pathlib", "PurePosixPath"): __import__("pathlib").PurePosixPath,
    **{
        ("torch", name): dtype
        for name in DTYPE_ITEMSIZE
        if isinstance(dtype := getattr(torch, name, None), torch.dtype)
    },
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise CorruptCheckpointError(f".metadata names {module}.{name}, not DCP metadata")
        return found


def load_metadata(data: bytes) -> dcp_metadata.Metadata:
    """DCP's metadata from the bytes of ``.metadata``; CorruptCheckpointError for anything
    that is not DCP metadata (a forged pickle never runs)."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # a truncated or garbled pickle
        raise CorruptCheckpointError(f".metadata does not load ({exc})") from exc
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise CorruptCheckpointError(f".metadata holds a {type(metadata).__name__}")
    return metadata
