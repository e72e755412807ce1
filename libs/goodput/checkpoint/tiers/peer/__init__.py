"""Peer data plane: files stream node to node over TCP, not through the message bus."""

from goodput.checkpoint.tiers.peer.auth import PeerAuthError
from goodput.checkpoint.tiers.peer.client import (
    GetResult,
    PeerClient,
    PeerError,
    PushReport,
    PutResult,
    SourceMismatch,
)
from goodput.checkpoint.tiers.peer.process import PeerServerProcess
from goodput.checkpoint.tiers.peer.server import PeerServer

__all__ = [
    "GetResult",
    "PeerAuthError",
    "PeerClient",
    "PeerError",
    "PeerServer",
    "PeerServerProcess",
    "PushReport",
    "PutResult",
    "SourceMismatch",
]
