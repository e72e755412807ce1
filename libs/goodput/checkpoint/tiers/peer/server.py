"""The peer data-plane server: serves one node's checkpoint volume to other nodes.

Paths in requests are relative to ``root`` and may not escape it or name hidden files. With
the job's key configured, a connection must prove it holds the key before its first request
(``goodput.checkpoint.tiers.peer.auth``), and a manifest committed here must carry its MAC.
Received files are written under a hidden ``.partial`` name keyed by their checksum,
verified, then renamed, so a retried transfer resumes from the bytes already on disk and a
partially-written file is never visible under its final name.

Every file is verified as it lands (hashed while received, or re-hashed when already
present or linked). A checkpoint whose every file was verified here, unchanged since, is
remembered at commit as verified on receive (:attr:`PeerServer.received`), so the node's
own scan need not hash it a second time.

Deduplication: the server indexes the checksums of every committed manifest under its root
and every file it received. A ``PutRequest`` for content it already holds is answered by
re-hashing the local copy (verification instead of transfer) and hard-linking it into place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from goodput.checkpoint.format import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    Signature,
    Xxh3,
    file_signature,
    file_xxh3_128,
    fsync_dir,
    hash_file,
    parse_manifest,
    partial_path,
    publish,
    read_manifest,
    write_manifest,
)
from goodput.checkpoint.format.job_key import FROM_ENV, Key, resolve_key
from goodput.checkpoint.tiers.peer.auth import authenticate_client
from goodput.checkpoint.tiers.peer.channel import Channel, ProtocolError, StreamWriteError
from goodput.checkpoint.tiers.peer.protocol import (
    CHECKSUM_MISMATCH,
    Ack,
    AuthHello,
    AuthProof,
    CommitRequest,
    ErrorReply,
    GetReply,
    GetRequest,
    PutReply,
    PutRequest,
    StatReply,
    StatRequest,
    request_decoder,
)

log = logging.getLogger(__name__)


class RequestRefused(Exception):
    """A request the server answers with an ErrorReply; the connection stays usable."""


class ChecksumIndex:
    """Where identical content lives on this node, by xxh3_128 (hints: always re-verified)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._paths: dict[str, set[Path]] = {}
        self._indexed_manifests: set[Path] = set()

    def add(self, xxh3_128: str, path: Path) -> None:
        self._paths.setdefault(xxh3_128, set()).add(path)

    def candidates(self, xxh3_128: str, size: int) -> list[Path]:
        if xxh3_128 not in self._paths:
            self._scan_new_manifests()
        found = []
        for path in list(self._paths.get(xxh3_128, ())):
            try:
                info = path.stat()
            except FileNotFoundError:
                self._paths[xxh3_128].discard(path)
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size == size:  # never a FIFO in its place
                found.append(path)
        return found

    def add_manifest(self, checkpoint_dir: Path, manifest: Manifest) -> None:
        self._indexed_manifests.add(checkpoint_dir)
        for entry in manifest.files:
            self.add(entry.xxh3_128, checkpoint_dir / entry.name)

    def _scan_new_manifests(self) -> None:
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            if MANIFEST_NAME not in filenames:
                continue
            checkpoint_dir = Path(dirpath)
            if checkpoint_dir in self._indexed_manifests:
                continue
            try:
                manifest = read_manifest(checkpoint_dir)
            except ManifestError:
                continue
            self.add_manifest(checkpoint_dir, manifest)


class PeerServer:
    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        on_commit: Callable[[Path], None] | None = None,
        track_received: bool = False,
        key: Key = FROM_ENV,
    ) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = port
        self.index = ChecksumIndex(self.root)
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._receiving: set[Path] = set()  # partials being written by a connection
        #: files verified here since they landed: path -> (xxh3_128, signature then)
        self._verified: dict[Path, tuple[str, Signature]] = {}
        #: committed checkpoints whose every file was verified here: directory -> the seal
        #: (``manifest_xxh3_128``) of the manifest they were verified against; recorded
        #: before the manifest appears, so no scan sees the copy first. Its reader (the
        #: replicator's scan) takes the entries it uses. Kept only with ``track_received``:
        #: a server with no such reader would only grow it
        self.received: dict[Path, str] = {}
        self._track_received = track_received
        #: called (in the event loop) after each commit, e.g. to index the copy at once
        self.on_commit = on_commit
        #: the job's key, which every connection must prove first (None: loopback, dev)
        self._key = resolve_key(key)

    async def start(self) -> None:
        listener = socket.create_server((self.host, self.port), reuse_port=False)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._accept_task = asyncio.create_task(self._accept_loop())

    async def serve_forever(self) -> None:
        assert self._accept_task is not None, "start() first"
        await self._accept_task

    async def close(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept_task
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()

    async def __aenter__(self) -> PeerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            sock, address = await loop.sock_accept(self._listener)
            task = asyncio.create_task(self._serve(Channel(sock), address))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _serve(self, channel: Channel, address: object) -> None:
        try:
            if self._key is not None:
                refused = await authenticate_client(channel, self._key)
                if refused is not None:
                    log.warning("peer connection from %s refused: %s", address, refused)
                    return
            while True:
                try:
                    request = await channel.receive(request_decoder)
                except ProtocolError:
                    return
                try:
                    await self._handle(channel, request)
                except RequestRefused as exc:
                    await channel.send(ErrorReply(str(exc)))
        except (ConnectionError, OSError) as exc:
            log.info("peer connection from %s ended: %s", address, exc)
        except Exception:
            log.exception("peer connection from %s failed", address)
        finally:
            channel.close()

    def _resolve(self, relative: str) -> Path:
        pure = PurePosixPath(relative)
        if (
            pure.is_absolute()
            or not pure.parts
            or any(p in ("..", ".") or p.startswith(".") for p in pure.parts)
        ):
            raise RequestRefused(f"path not allowed: {relative!r}")
        return self.root.joinpath(*pure.parts)

    async def _handle(self, channel: Channel, request: object) -> None:
        match request:
            case StatRequest(path=path):
                await channel.send(await asyncio.to_thread(self._stat, self._resolve(path)))
            case PutRequest():
                await self._put(channel, request)
            case GetRequest(path=path, offset=offset):
                await self._get(channel, self._resolve(path), offset)
            case AuthHello() | AuthProof():
                raise RequestRefused(
                    "this peer has no checkpoint key (GOODPUT_CKPT_KEY_FILE): it cannot prove one"
                )
            case CommitRequest(path=path, manifest=manifest):
                directory = self._resolve(path)
                await asyncio.to_thread(self._commit, directory, manifest)
                await channel.send(Ack())
                if self.on_commit is not None:
                    self.on_commit(directory)

    @staticmethod
    def _stat(path: Path) -> StatReply:
        if not path.is_file():
            return StatReply(exists=False)
        return StatReply(exists=True, size=path.stat().st_size, xxh3_128=file_xxh3_128(path))

    async def _put(self, channel: Channel, request: PutRequest) -> None:
        final = self._resolve(request.path)
        if final.name == MANIFEST_NAME:
            raise RequestRefused("manifests are published with CommitRequest, after the files")
        how = await asyncio.to_thread(self._have, final, request.size, request.xxh3_128)
        if how:
            await channel.send(PutReply(have=True, how=how))
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = partial_path(final, request.xxh3_128)
        if partial in self._receiving:
            raise RequestRefused(f"{request.path} is being received on another connection")
        self._receiving.add(partial)
        try:
            await self._receive(channel, request, final, partial)
        finally:
            self._receiving.discard(partial)

    async def _receive(
        self, channel: Channel, request: PutRequest, final: Path, partial: Path
    ) -> None:
        offset = partial.stat().st_size if partial.exists() else 0
        if offset > request.size:
            offset = 0
        hasher = await asyncio.to_thread(hash_file, partial, None, offset) if offset else None
        hasher = hasher or Xxh3()
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != offset:  # ext4 flushes on close after a truncate
                os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
            await channel.send(PutReply(have=False, offset=offset))
            await channel.receive_to_file(fd, request.size - offset, hasher)
        except StreamWriteError as exc:
            partial.unlink(missing_ok=True)  # free the space; the sender may retry later
            await channel.send(ErrorReply(f"cannot store {request.path}: {exc}"))
            return
        finally:
            os.close(fd)
        if hasher.hexdigest() != request.xxh3_128:
            partial.unlink(missing_ok=True)
            await channel.send(
                ErrorReply(f"checksum mismatch for {request.path}", code=CHECKSUM_MISMATCH)
            )
            return
        await asyncio.to_thread(publish, partial, final)
        self._mark_verified(final, request.xxh3_128)
        self.index.add(request.xxh3_128, final)
        await channel.send(Ack())

    def _have(self, final: Path, size: int, xxh3_128: str) -> str:
        """Return how the content is already here ("present"/"linked"), or "" to receive it."""
        if final.is_file() and final.stat().st_size == size and file_xxh3_128(final) == xxh3_128:
            self._mark_verified(final, xxh3_128)
            return "present"
        for candidate in self.index.candidates(xxh3_128, size):
            if candidate == final or file_xxh3_128(candidate) != xxh3_128:
                continue
            final.parent.mkdir(parents=True, exist_ok=True)
            temp = final.with_name(f".{final.name}.{os.getpid()}.link")
            temp.unlink(missing_ok=True)
            try:
                os.link(candidate, temp)
            except OSError:
                shutil.copyfile(candidate, temp)
            os.replace(temp, final)
            fsync_dir(final.parent)
            self._mark_verified(final, xxh3_128)
            self.index.add(xxh3_128, final)
            return "linked"
        return ""

    async def _get(self, channel: Channel, path: Path, offset: int) -> None:
        if not path.is_file():
            raise RequestRefused(f"no such file: {path.relative_to(self.root)}")
        size = path.stat().st_size
        if not 0 <= offset <= size:
            raise RequestRefused(f"offset {offset} outside file of {size} bytes")
        await channel.send(GetReply(size=size, offset=offset))
        await channel.send_file(path, offset, size - offset)

    def _commit(self, directory: Path, manifest_bytes: bytes) -> None:
        try:
            manifest = parse_manifest(manifest_bytes)
        except ManifestError as exc:
            raise RequestRefused(str(exc)) from exc
        for entry in manifest.files:
            path = directory / entry.name
            if not path.is_file() or path.stat().st_size != entry.size:
                raise RequestRefused(f"cannot commit {directory.name}: {entry.name} missing")
        if self._track_received and self._all_verified(directory, manifest):
            self.received[directory] = manifest.manifest_xxh3_128
        write_manifest(directory, manifest)
        self.index.add_manifest(directory, manifest)

    def _mark_verified(self, path: Path, xxh3_128: str) -> None:
        if self._track_received:
            self._verified[path] = (xxh3_128, file_signature(path))

    def _all_verified(self, directory: Path, manifest: Manifest) -> bool:
        """Whether every file of ``directory`` was verified here against ``manifest`` and is
        unchanged since (the records are used up either way)."""
        verdict = True
        for entry in manifest.files:
            path = directory / entry.name
            seen = self._verified.pop(path, None)
            try:
                unchanged = seen is not None and seen[1] == file_signature(path)
            except OSError:
                unchanged = False
            verdict = verdict and unchanged and seen is not None and seen[0] == entry.xxh3_128
        return verdict
