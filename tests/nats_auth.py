"""NATS decentralized-auth credentials minted in Python, for tests (no ``nsc`` binary here).

An operator signs accounts, an account signs users (``nsc``'s chain of trust). Every identity
is an nkey (ed25519, base32 with a role prefix: O…, A…, U…; seeds S…). A JWT is three
base64url parts — header, claims, signature — where the signature is the issuer's ed25519
signature of ``header.claims``; the server checks the chain from the operator it trusts down
to the user that signs the connection's nonce. A creds file is the user JWT and seed between
the markers ``nsc generate creds`` writes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import nkeys

#: unlimited account limits, with JetStream on (memory and disk storage not 0)
UNLIMITED_ACCOUNT = {
    "limits": {
        "subs": -1,
        "data": -1,
        "payload": -1,
        "imports": -1,
        "exports": -1,
        "wildcards": True,
        "conn": -1,
        "leaf": -1,
        "mem_storage": -1,
        "disk_storage": -1,
        "streams": -1,
        "consumer": -1,
    }
}
UNLIMITED_USER = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}


def new_key(prefix: int) -> nkeys.KeyPair:
    """A fresh nkey of one role (``nkeys.PREFIX_BYTE_OPERATOR``, ``_ACCOUNT``, ``_USER``)."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def public(key: nkeys.KeyPair) -> str:
    return key.public_key.decode()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def mint_jwt(subject: str, issuer: nkeys.KeyPair, name: str, nats: dict[str, Any]) -> str:
    """A NATS JWT (claims version 2) about ``subject``, signed by ``issuer``.

    ``jti``, the claims' id, is a base32 SHA-512/256 of the claims without it, as nsc makes it.
    """
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": public(issuer),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    digest = hashlib.new("sha512_256", json.dumps(claims).encode()).digest()
    claims["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    header = _b64url(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64url(json.dumps(claims).encode())
    signature = issuer.sign(f"{header}.{body}".encode())
    return f"{header}.{body}.{_b64url(signature)}"


def creds_text(user_jwt: str, user_seed: str) -> str:
    """A creds file's content, as ``nsc generate creds`` lays it out."""
    return (
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user_seed}\n------END USER NKEY SEED------\n"
    )


@dataclass(frozen=True)
class Operator:
    """An operator with a system account and one account for goodput, and the server
    configuration that trusts them (``resolver: MEMORY``, the account JWTs preloaded)."""

    key: nkeys.KeyPair
    system: nkeys.KeyPair
    account: nkeys.KeyPair

    @classmethod
    def create(cls) -> Operator:
        return cls(
            key=new_key(nkeys.PREFIX_BYTE_OPERATOR),
            system=new_key(nkeys.PREFIX_BYTE_ACCOUNT),
            account=new_key(nkeys.PREFIX_BYTE_ACCOUNT),
        )

    def server_config(self) -> str:
        """The operator-mode lines of a nats-server configuration."""
        operator_jwt = mint_jwt(public(self.key), self.key, "goodput-test", {"type": "operator"})
        system_jwt = mint_jwt(public(self.system), self.key, "SYS", {"type": "account"})
        account_jwt = mint_jwt(
            public(self.account), self.key, "GOODPUT", {"type": "account", **UNLIMITED_ACCOUNT}
        )
        return (
            f'operator: "{operator_jwt}"\n'
            f"system_account: {public(self.system)}\n"
            "resolver: MEMORY\n"
            f'resolver_preload: {{\n  {public(self.system)}: "{system_jwt}"\n'
            f'  {public(self.account)}: "{account_jwt}"\n}}\n'
        )

    def user_creds(self, name: str = "goodput") -> str:
        """A creds file's content for a new user of goodput's account."""
        user = new_key(nkeys.PREFIX_BYTE_USER)
        user_jwt = mint_jwt(public(user), self.account, name, {"type": "user", **UNLIMITED_USER})
        return creds_text(user_jwt, user.seed.decode())
