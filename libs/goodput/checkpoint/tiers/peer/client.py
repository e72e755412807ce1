"""Client side of the peer data plane: push a checkpoint to a peer, pull files from it,
ask it for the checksum of what it holds."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

from goodput.checkpoint.format import (
    MANIFEST_NAME,
    ChecksumMismatch,
    FileEntry,
    Manifest,
    Xxh3,
    hash_file,
    parse_manifest,
    read_manifest,
)
from goodput.checkpoint.format.job_key import FROM_ENV, Key, resolve_key
from goodput.checkpoint.tiers.peer.auth import authenticate_to_server
from goodput.checkpoint.tiers.peer.channel import Channel, Progress, ProtocolError, open_channel
from goodput.checkpoint.tiers.peer.protocol import (
    CHECKSUM_MISMATCH,
    MAX_HEADER_BYTES,
    Ack,
    CommitRequest,
    ErrorReply,
    GetReply,
    GetRequest,
    PutReply,
    PutRequest,
    StatReply,
    StatRequest,
    reply_decoder,
)
from goodput.checkpoint.tiers.streams import STREAMS, largest_first


class PeerError(RuntimeError):
    """The peer refused a request (bad path, missing file, checksum mismatch on its side)."""


class SourceMismatch(PeerError):
    """What the peer received does not hash to the manifest's digest: the source file itself
    may be damaged (its owner trusted it by size since the engine sealed it)."""


@dataclass(frozen=True)
class PutResult:
    bytes_sent: int
    bytes_skipped: int  # already there (deduplicated or resumed): not sent again
    how: str  # "sent", "resumed", "present" or "linked"


@dataclass(frozen=True)
class PushReport:
    files_sent: int
    files_skipped: int
    bytes_sent: int
    bytes_skipped: int
    seconds: float


@dataclass(frozen=True)
class GetResult:
    bytes_received: int
    resumed_from: int


class PeerClient:
    """One connection to a peer's :class:`~goodput.checkpoint.tiers.peer.server.PeerServer`.

    Requests on one client are sequential; use several clients for parallel transfers.
    """

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    @classmethod
    async def connect(
        cls, host: str, port: int, timeout_s: float = 10.0, key: Key = FROM_ENV
    ) -> PeerClient:
        """Connect and, with the job's key (configured by default), prove it and have the
        peer prove it (PeerAuthError, a ConnectionError, otherwise)."""
        channel = await open_channel(host, port, timeout_s)
        secret = resolve_key(key)
        if secret is not None:
            try:
                await asyncio.wait_for(authenticate_to_server(channel, secret), timeout_s)
            except BaseException:
                channel.close()
                raise
        return cls(channel)

    async def close(self) -> None:
        self._channel.close()

    async def __aenter__(self) -> PeerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _reply(self, expected: type):
        reply = await self._channel.receive(reply_decoder)
        if isinstance(reply, ErrorReply):
            if reply.code == CHECKSUM_MISMATCH:
                raise SourceMismatch(reply.message)
            raise PeerError(reply.message)
        if not isinstance(reply, expected):
            raise ProtocolError(f"expected {expected.__name__}, got {type(reply).__name__}")
        return reply

    async def stat(self, remote_path: str) -> StatReply:
        """Size and checksum *computed by the peer* over the file it holds."""
        await self._channel.send(StatRequest(remote_path))
        return await self._reply(StatReply)

    async def put_file(
        self,
        local_path: Path,
        remote_path: str,
        size: int,
        xxh3_128: str,
        progress: Progress | None = None,
    ) -> PutResult:
        await self._channel.send(PutRequest(remote_path, size, xxh3_128))
        reply: PutReply = await self._reply(PutReply)
        if reply.have:
            return PutResult(bytes_sent=0, bytes_skipped=size, how=reply.how)
        await self._channel.send_file(Path(local_path), reply.offset, size - reply.offset, progress)
        await self._reply(Ack)
        return PutResult(
            bytes_sent=size - reply.offset,
            bytes_skipped=reply.offset,
            how="resumed" if reply.offset else "sent",
        )

    async def commit(self, remote_dir: str, manifest: bytes) -> None:
        await self._channel.send(CommitRequest(remote_dir, manifest))
        await self._reply(Ack)

    async def push_checkpoint(
        self,
        checkpoint_dir: Path,
        remote_dir: str,
        progress: Progress | None = None,
        streams: int = STREAMS,
    ) -> PushReport:
        """Replicate a committed checkpoint: each file (deduplicated/resumed by the peer),
        then the manifest, so the peer's copy becomes visible only when complete.

        Files go over up to ``streams`` connections at once (this one and extra ones to the
        same peer, largest files first), so one file's fsync and the next file's transfer
        overlap. If any file fails, the other connections finish the file they are on and
        take no more, the first error is raised, and nothing is committed: the peer holds no
        manifest for the step, and a retry resumes from the verified or partial files it has.
        """
        started = time.perf_counter()
        checkpoint_dir = Path(checkpoint_dir)
        manifest = read_manifest(checkpoint_dir)
        clients: list[PeerClient] = [self]

        async def put(entry: FileEntry, stream: int) -> PutResult:
            return await clients[stream].put_file(
                checkpoint_dir / entry.name,
                f"{remote_dir}/{entry.name}",
                entry.size,
                entry.xxh3_128,
                progress,
            )

        try:
            if streams > 1 and len(manifest.files) > 1:
                host, port = self._channel.sock.getpeername()[:2]
                for _ in range(min(streams, len(manifest.files)) - 1):
                    clients.append(await PeerClient.connect(host, port))
            results = await largest_first(manifest.files, lambda e: e.size, put, len(clients))
        finally:
            for client in clients[1:]:
                await client.close()
        await self.commit(remote_dir, manifest.to_bytes())
        sent = sum(r.bytes_sent for r in results)
        skipped = sum(r.bytes_skipped for r in results)
        files_sent = sum(1 for r in results if r.bytes_sent)
        return PushReport(
            files_sent, len(results) - files_sent, sent, skipped, time.perf_counter() - started
        )

    async def fetch_manifest(self, remote_dir: str) -> Manifest:
        """The manifest of a checkpoint the peer holds (what to restore from it)."""
        await self._channel.send(GetRequest(f"{remote_dir}/{MANIFEST_NAME}"))
        reply: GetReply = await self._reply(GetReply)
        if reply.size > MAX_HEADER_BYTES:
            raise ProtocolError(f"manifest of {reply.size} bytes is implausibly large")
        return parse_manifest(await self._channel.read_exact(reply.size))

    async def get_file(
        self,
        remote_path: str,
        partial: Path,
        size: int,
        xxh3_128: str,
        progress: Progress | None = None,
    ) -> GetResult:
        """Fetch into ``partial`` (a hidden temp name), resuming from its current length,
        and verify the whole file. The caller publishes it under its final name (its fsync
        makes it durable). A pull is a restore, read right after: the bytes are written
        through the page cache (``FileSink``'s ``cached``), not with O_DIRECT as a push's."""
        partial = Path(partial)
        offset = partial.stat().st_size if partial.exists() else 0
        if offset > size:
            offset = 0
        hasher = await asyncio.to_thread(hash_file, partial, None, offset) if offset else None
        hasher = hasher or Xxh3()
        await self._channel.send(GetRequest(remote_path, offset))
        reply: GetReply = await self._reply(GetReply)
        if reply.size != size:
            raise ChecksumMismatch(f"peer holds {reply.size} bytes of {remote_path}, want {size}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != offset:  # ext4 flushes on close after a truncate
                os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
            await self._channel.receive_to_file(fd, size - offset, hasher, progress, cached=True)
        finally:
            os.close(fd)
        if hasher.hexdigest() != xxh3_128:
            partial.unlink(missing_ok=True)
            raise ChecksumMismatch(f"{remote_path} from peer: xxh3_128 {hasher.hexdigest()}")
        return GetResult(bytes_received=size - offset, resumed_from=offset)
