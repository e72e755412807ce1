"""The job's checkpoint key: where it comes from, how manifests are signed and checked with it.

A tier can cross a trust boundary (a peer's TCP data plane, a bucket, a shared volume), and
whoever can write into it can also write a manifest: a digest anyone can recompute proves
nothing about who wrote it. With a key, every manifest the job seals carries an HMAC-SHA256
over its canonical encoding, and every reader refuses one whose MAC is missing or wrong; the
peer data plane proves possession of the same key on connect (``tiers.peer.auth``).

The key is a per-job secret in a file named by ``GOODPUT_CKPT_KEY_FILE``: the stack creates
it in its state directory (mode 0600) when a job's stack starts and hands the variable to the
actuator, the ranks and the replicators; on Kubernetes it is a mounted Secret. Unset, nothing
is signed or checked (loopback and development), and ``goodput ckpt verify`` says so.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from goodput.state_dir import StateDir

#: the environment variable naming the key file (ranks, actuator, replicators, CLI)
KEY_FILE_ENV = "GOODPUT_CKPT_KEY_FILE"
#: the key file's name in a stack's state directory
#: a key shorter than this (bytes of the file, whitespace stripped) is refused as guessable
MIN_KEY_BYTES = 32
_MAX_KEY_FILE_BYTES = 4096


class JobKeyError(ValueError):
    """The key file is configured but unusable; the message names it and why."""


def key_file_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The configured key file (None: no key, manifests are neither signed nor checked)."""
    path = (os.environ if env is None else env).get(KEY_FILE_ENV, "")
    return path or None


def key_env(path: str | os.PathLike) -> dict[str, str]:
    """The variables that hand the key file at ``path`` to a child process."""
    return {KEY_FILE_ENV: str(Path(path).absolute())}


@lru_cache(maxsize=8)
def load_key(path: str) -> bytes:
    """The key in ``path`` (read once per process: a job's key does not change under it)."""
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise JobKeyError(f"checkpoint key {path}: {exc.strerror or exc}") from None
    key = data.strip()
    if len(data) > _MAX_KEY_FILE_BYTES or len(key) < MIN_KEY_BYTES:
        raise JobKeyError(
            f"checkpoint key {path}: expected {MIN_KEY_BYTES} to {_MAX_KEY_FILE_BYTES} bytes"
            " (e.g. the output of 'openssl rand -hex 32')"
        )
    return key


def configured_key(env: Mapping[str, str] | None = None) -> bytes | None:
    """The job's key if ``GOODPUT_CKPT_KEY_FILE`` names one; JobKeyError if it cannot be read
    (a configured key that cannot be read must not turn into no key at all)."""
    path = key_file_from_env(env)
    return None if path is None else load_key(path)


class _FromEnv:
    """The key ``GOODPUT_CKPT_KEY_FILE`` names (or none): what every signer, reader and peer
    uses unless its caller passes a key (or None) itself."""

    def __repr__(self) -> str:
        return "FROM_ENV"


#: the default key of manifests and the peer data plane: the job's configured one
FROM_ENV = _FromEnv()
#: a key as callers pass it: the bytes, None (no key), or :data:`FROM_ENV`
Key = bytes | None | _FromEnv


def resolve_key(key: Key) -> bytes | None:
    """``key`` itself, or the configured one for :data:`FROM_ENV` (JobKeyError if unusable)."""
    return configured_key() if isinstance(key, _FromEnv) else key


def create_key_file(path: str | os.PathLike) -> Path:
    """Create a new random key at ``path`` (mode 0600 from the start), or keep the one there:
    a job's stack restarted on the same state directory must still read its checkpoints."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        load_key(str(path.absolute()))  # an existing key must be usable
        return path
    try:
        os.write(fd, secrets.token_hex(32).encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def stack_key_env(state_dir: str | os.PathLike) -> dict[str, str]:
    """What a stack hands its services (and they their ranks): the key the environment
    already names, else the state directory's own, created when its stack first starts
    (SystemExit, one line, when that key cannot be made or read)."""
    configured = key_file_from_env()
    try:
        return key_env(configured or create_key_file(StateDir(Path(state_dir)).ckpt_key))
    except (JobKeyError, OSError) as exc:  # the stack cannot start without it: one line
        raise SystemExit(f"cannot set up the checkpoint key: {exc}") from None


def adopt_stack_key(state_dir: str | os.PathLike) -> str | None:
    """For a tool run beside a stack (``goodput ckpt``): the configured key file, else the
    stack's in ``state_dir`` if there is one, now configured for this process."""
    configured = key_file_from_env()
    own = StateDir(Path(state_dir)).ckpt_key
    if configured is None and own.is_file():
        configured = key_env(own)[KEY_FILE_ENV]
        os.environ[KEY_FILE_ENV] = configured
    return configured


def sign(body: bytes, key: bytes) -> str:
    """The MAC of ``body`` under ``key`` (hex HMAC-SHA256)."""
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def is_signed_by(body: bytes, mac: str, key: bytes) -> bool:
    """Whether ``mac`` is ``body``'s MAC under ``key`` (constant-time comparison)."""
    return hmac.compare_digest(sign(body, key), mac)
