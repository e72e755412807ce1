"""``stack.json``: what `goodput up` started in a state directory, for `down`, `status`, chaos.

Each service is recorded by its keeper's :class:`~goodput.owned_process.ProcessIdentity` (the
keeper restarts the service: :mod:`.keeper`), never a bare pid, so a record that outlived its
processes is recognised as stale and never signalled.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from goodput.owned_process import ProcessIdentity, RecordUnreadable
from goodput.state_dir import StateDir


class ServiceProcess(msgspec.Struct, kw_only=True):
    name: str
    node: str
    #: the service's keeper (its process group holds the service)
    process: ProcessIdentity
    log: str

    @property
    def key(self) -> str:
        return f"{self.name}@{self.node}" if self.node else self.name

    @property
    def pid(self) -> int:
        """The keeper's pid (the service's own is in its health record)."""
        return self.process.pid


class StackRecord(msgspec.Struct, kw_only=True):
    job: str
    url: str
    embedded: bool
    nodes: list[str]
    services: list[ServiceProcess]


def read_stack(state_dir: Path) -> StackRecord | None:
    """The stack's record, or None; raises :class:`RecordUnreadable` (one line) if it cannot be
    decoded (truncated, corrupt, or written by a release that recorded bare pids)."""
    path = StateDir(state_dir).stack_record
    if not path.exists():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=StackRecord)
    except msgspec.DecodeError as exc:
        raise RecordUnreadable(
            f"the stack record {path} is unreadable ({exc}); `goodput down --state-dir "
            f"{state_dir}` finds and stops the stack's processes without it"
        ) from None


def write_stack(state_dir: Path, record: StackRecord) -> None:
    path = StateDir(state_dir).stack_record
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(record)))
    os.replace(tmp, path)
