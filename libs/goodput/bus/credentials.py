"""The credential files a client signs in with, checked before it connects.

nats-py reads a creds file or an nkey seed only while it connects, with the ``nkeys`` package
it imports then: a process without ``nkeys`` failed every connection with a traceback, and a
creds file without a user JWT block sends nats-py's reader into an endless loop. Each problem
is found here first and said in one line (:class:`BusCredentialsError`), without the secret.
"""

from __future__ import annotations

from pathlib import Path


class BusSettingsError(RuntimeError):
    """Bus settings that cannot work: retrying will not help, the operator must change them."""


class BusCredentialsError(BusSettingsError):
    """A credential or TLS file that is missing or unusable, a missing ``nkeys`` package, or
    credentials the server refused."""


#: the markers nats-py looks for in a creds file (``nsc generate creds`` writes them)
JWT_MARKER = "BEGIN NATS USER JWT"
SEED_MARKER = "BEGIN USER NKEY SEED"

NKEYS_MISSING = (
    "signing in with a creds file or an nkey seed needs the nkeys package, which is not "
    "installed: pip install 'nats-py[nkeys]'"
)


def check_signing_files(creds_file: str, nkey_seed_file: str) -> None:
    """Refuse, in one line, a creds file or nkey seed file (existing) that nats-py could not
    sign in with, or a process that lacks ``nkeys`` to sign with them."""
    if not (creds_file or nkey_seed_file):
        return
    try:
        import nkeys
    except ImportError:
        raise BusCredentialsError(NKEYS_MISSING) from None
    if creds_file:
        lines = _lines(creds_file, "creds file")
        if not _after(lines, JWT_MARKER):
            raise BusCredentialsError(f"creds file {creds_file} holds no user JWT ({JWT_MARKER})")
        _check_seed(nkeys, _after(lines, SEED_MARKER), f"creds file {creds_file}")
    if nkey_seed_file:
        seed = "".join(_lines(nkey_seed_file, "nkey seed file"))
        _check_seed(nkeys, seed, f"nkey seed file {nkey_seed_file}")


def _lines(path: str, what: str) -> list[str]:
    try:
        return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise BusCredentialsError(f"cannot read {what} {path}: {exc}") from None


def _after(lines: list[str], marker: str) -> str:
    """The line after the one holding ``marker`` ("" if none)."""
    for index, line in enumerate(lines[:-1]):
        if marker in line:
            return lines[index + 1]
    return ""


def _check_seed(nkeys, seed: str, where: str) -> None:
    """A user seed (``SU…``) that decodes; what is wrong, never the seed itself."""
    try:
        prefix, _ = nkeys.decode_seed(seed.encode())
    except (nkeys.NkeysError, ValueError):
        raise BusCredentialsError(f"{where} holds no valid nkey seed") from None
    if prefix != nkeys.PREFIX_BYTE_USER:
        raise BusCredentialsError(f"{where}: the nkey seed is not a user's (SU…)")
