"""Who may use a node's peer data plane: only a peer that holds the job's checkpoint key.

The data plane is plain TCP between nodes, so anyone who can reach the port could otherwise
read a node's checkpoints or push files into its volume. With a key configured
(``goodput.checkpoint.format.job_key``), each connection opens with a challenge-response in
both directions before any request: the client sends a fresh nonce, the server answers with
an HMAC-SHA256 over it (proving it holds the key) and a nonce of its own, and the client
answers with its HMAC over that. Each proof is bound to its role and to both nonces, so no
proof can be replayed on another connection or reflected back. A server refuses a connection
that does not prove the key (one log line) before it reads or offers anything.

What travels after the handshake is not MAC'd message by message: the files' integrity rests
on the manifest, whose MAC every reader checks, and whose digests cover every byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets

from goodput.checkpoint.tiers.peer.channel import Channel, ProtocolError
from goodput.checkpoint.tiers.peer.protocol import (
    Ack,
    AuthChallenge,
    AuthHello,
    AuthProof,
    ErrorReply,
    reply_decoder,
    request_decoder,
)

NONCE_BYTES = 32
#: an unauthenticated connection is dropped after this long (it holds a server task)
HANDSHAKE_TIMEOUT_S = 10.0
_SERVER = b"goodput-peer/1 server\x00"
_CLIENT = b"goodput-peer/1 client\x00"


class PeerAuthError(ConnectionError):
    """The other side did not prove that it holds the job's checkpoint key."""


def _proof(key: bytes, role: bytes, theirs: bytes, mine: bytes) -> bytes:
    return hmac.new(key, role + theirs + mine, hashlib.sha256).digest()


async def authenticate_to_server(channel: Channel, key: bytes) -> None:
    """The client's side; raises PeerAuthError unless both sides proved the key."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    await channel.send(AuthHello(nonce))
    reply = await channel.receive(reply_decoder)
    if isinstance(reply, ErrorReply):
        raise PeerAuthError(f"peer refused the connection: {reply.message}")
    if not isinstance(reply, AuthChallenge) or len(reply.nonce) != NONCE_BYTES:
        raise PeerAuthError(f"peer answered the key challenge with {type(reply).__name__}")
    if not hmac.compare_digest(reply.proof, _proof(key, _SERVER, nonce, reply.nonce)):
        raise PeerAuthError("peer does not hold the job's checkpoint key")
    await channel.send(AuthProof(_proof(key, _CLIENT, reply.nonce, nonce)))
    done = await channel.receive(reply_decoder)
    if not isinstance(done, Ack):
        detail = done.message if isinstance(done, ErrorReply) else type(done).__name__
        raise PeerAuthError(f"peer refused the connection: {detail}")


async def authenticate_client(channel: Channel, key: bytes) -> str | None:
    """The server's side: None once the client proved the key, else why it is refused (it
    was told, and nothing was read or offered)."""
    try:
        return await asyncio.wait_for(_challenge(channel, key), HANDSHAKE_TIMEOUT_S)
    except TimeoutError:
        return f"no key proof within {HANDSHAKE_TIMEOUT_S:.0f} s"
    except ProtocolError as exc:
        return f"handshake broken off ({exc})"


async def _challenge(channel: Channel, key: bytes) -> str | None:
    hello = await channel.receive(request_decoder)
    if not isinstance(hello, AuthHello) or len(hello.nonce) != NONCE_BYTES:
        await channel.send(ErrorReply("this peer requires the job's checkpoint key"))
        return f"sent {type(hello).__name__} without proving the job's checkpoint key"
    nonce = secrets.token_bytes(NONCE_BYTES)
    await channel.send(AuthChallenge(nonce, _proof(key, _SERVER, hello.nonce, nonce)))
    answer = await channel.receive(request_decoder)
    if not isinstance(answer, AuthProof) or not hmac.compare_digest(
        answer.proof, _proof(key, _CLIENT, nonce, hello.nonce)
    ):
        await channel.send(ErrorReply("wrong proof of the job's checkpoint key"))
        return "wrong proof of the job's checkpoint key"
    await channel.send(Ack())
    return None
