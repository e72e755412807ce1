"""Wire format of the peer data plane.

Every message is a 4-byte big-endian length followed by a msgpack-encoded tagged msgspec
struct. Raw file bytes follow a message only where the protocol says so, and their count
is always stated in a header first: after ``PutReply(have=False)`` the client sends
``size - offset`` bytes; after ``GetReply`` the server sends ``size - offset`` bytes.

    client                         server
    AuthHello               ->     AuthChallenge | ErrorReply   (first, when a key is set:
    AuthProof               ->     Ack | ErrorReply              ``goodput.checkpoint.tiers.peer.auth``)
    StatRequest             ->     StatReply | ErrorReply
    PutRequest              ->     PutReply | ErrorReply
      [raw bytes]           ->     Ack | ErrorReply        (only when PutReply.have is False)
    GetRequest              ->     GetReply + [raw bytes] | ErrorReply
    CommitRequest           ->     Ack | ErrorReply
"""

from __future__ import annotations

import struct

import msgspec

PROTOCOL_VERSION = 1
HEADER_LENGTH = struct.Struct(">I")
MAX_HEADER_BYTES = 16 << 20  # a manifest rides in CommitRequest; anything bigger is garbage


class StatRequest(msgspec.Struct, tag="stat"):
    """Ask for the size and the *computed* checksum of a file the peer holds."""

    path: str


class PutRequest(msgspec.Struct, tag="put"):
    """Offer a file. The server answers whether it already has those bytes (at ``path`` or,
    deduplicated, anywhere in its index) and otherwise from which offset to send."""

    path: str
    size: int
    xxh3_128: str


class GetRequest(msgspec.Struct, tag="get"):
    path: str
    offset: int = 0


class CommitRequest(msgspec.Struct, tag="commit"):
    """Publish a checkpoint directory on the peer: checks its files, writes the manifest."""

    path: str
    manifest: bytes


class AuthHello(msgspec.Struct, tag="auth_hello"):
    """The client's challenge: the server proves it holds the job's key over this nonce."""

    nonce: bytes


class AuthProof(msgspec.Struct, tag="auth_proof"):
    """The client's proof over the server's challenge (and its own nonce)."""

    proof: bytes


Request = StatRequest | PutRequest | GetRequest | CommitRequest | AuthHello | AuthProof


class StatReply(msgspec.Struct, tag="stat_reply"):
    exists: bool
    size: int = 0
    xxh3_128: str = ""


class PutReply(msgspec.Struct, tag="put_reply"):
    """``have``: no bytes needed; ``how`` says why ("present" at the path, or "linked" from a
    verified identical file). Otherwise the client sends bytes from ``offset`` (resume)."""

    have: bool
    offset: int = 0
    how: str = ""


class GetReply(msgspec.Struct, tag="get_reply"):
    size: int
    offset: int


class Ack(msgspec.Struct, tag="ack"):
    pass


class AuthChallenge(msgspec.Struct, tag="auth_challenge"):
    """The server's proof over the client's nonce, and its own challenge."""

    nonce: bytes
    proof: bytes


#: ``ErrorReply.code`` of received bytes that do not hash to the digest the sender offered:
#: the sender's own file may be damaged (it re-checks it)
CHECKSUM_MISMATCH = "checksum_mismatch"


class ErrorReply(msgspec.Struct, tag="error"):
    message: str
    code: str = ""


Reply = StatReply | PutReply | GetReply | Ack | ErrorReply | AuthChallenge

_encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(Request)
reply_decoder = msgspec.msgpack.Decoder(Reply)


def frame(message: msgspec.Struct) -> bytes:
    body = _encoder.encode(message)
    return HEADER_LENGTH.pack(len(body)) + body
