"""Where an object store is, as one URI: the only spelling of a store outside this package.

``file:///abs/path`` (a directory: the embedded default, or a shared volume),
``gs://bucket[/prefix][?endpoint=http://host:port]`` (Google Cloud Storage; the endpoint
names an emulator such as fake-gcs-server, and its requests carry no credentials) and
``s3://bucket[/prefix][?endpoint=http(s)://host:port][&region=name]`` (Amazon S3, or with an
endpoint an S3-compatible store: MinIO, Ceph RGW, an emulator; credentials come from the
client library's standard chain either way, see :mod:`goodput.checkpoint.tiers.s3`). The
spellings of earlier releases stay accepted, because users' configurations hold them:
``dir:<path>`` is ``file://<path>``, ``gcs:<bucket>`` is ``gs://<bucket>``, and the separate
emulator setting (:data:`LEGACY_ENDPOINT_KEY`, in replicator options and in index records
of schema 2 and before) folds into the URI's ``endpoint``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit

#: the setting earlier releases kept the emulator URL of a ``gcs:`` store in
LEGACY_ENDPOINT_KEY = "gcs_endpoint"
SUPPORTED = (
    "'file:///<absolute path>', 'gs://<bucket>[/<prefix>][?endpoint=<url>]' or "
    "'s3://<bucket>[/<prefix>][?endpoint=<url>][&region=<region>]'"
)

StoreScheme = Literal["file", "gs", "s3"]

# GCS bucket names: 3-63 of lowercase letters, digits, '-', '_', '.', starting and ending
# with a letter or digit (the dotted 222-character form is not needed here)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
# S3 bucket names: the same without '_', and not shaped like an IPv4 address
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4 = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}")
# AWS region names (us-east-1, eu-central-2, us-gov-west-1); an S3-compatible store may
# name its own, so only the spelling is checked: letters, digits and '-'
_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_NETLOC = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


class StoreUriError(ValueError):
    """A store URI this build cannot use; its message is one line for the user."""


@dataclass(frozen=True)
class StoreUri:
    """A parsed store URI: ``where`` is the directory (``file``) or the bucket (``gs``,
    ``s3``); ``region`` is an S3 store's only."""

    scheme: StoreScheme
    where: str
    prefix: str = ""
    endpoint: str = ""
    region: str = ""

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{quote(self.where)}"
        fields = [("endpoint", self.endpoint), ("region", self.region)]
        query = "&".join(f"{name}={value}" for name, value in fields if value)
        path = f"/{self.prefix}" if self.prefix else ""
        return f"{self.scheme}://{self.where}{path}{'?' + query if query else ''}"

    def key_uri(self, key: str) -> str:
        """The URI of one object in this store (what events name a backup by)."""
        if self.scheme == "file":
            return f"file://{quote(str(PurePosixPath(self.where, key)))}"
        return f"{self.scheme}://{self.where}/{self.prefix + '/' if self.prefix else ''}{key}"


def parse_store_uri(text: str, legacy_endpoint: str = "") -> StoreUri:
    """``text`` as a store URI (or an earlier spelling); :class:`StoreUriError` if unusable.

    ``legacy_endpoint`` is the separate emulator setting of earlier releases: it applies to a
    ``gs`` store only, and may not contradict an endpoint the URI names itself.
    """
    text = text.strip()
    kind, colon, rest = text.partition(":")
    if not colon or not rest:
        raise StoreUriError(f"object store {text!r} is not a store URI: use {SUPPORTED}")
    if kind == "dir":
        uri = _file(rest, text)
    elif kind == "gcs":
        uri = _gs(rest, "", "", text)
    elif kind == "file":
        uri = _parse_file(text)
    elif kind in ("gs", "s3"):
        parts = urlsplit(text)
        if parts.fragment:
            raise StoreUriError(f"object store {text!r}: a {kind}:// URI has no '#' part")
        parse = _gs if kind == "gs" else _s3
        uri = parse(parts.netloc, parts.path.strip("/"), parts.query, text)
    else:
        raise StoreUriError(f"object store {text!r}: unknown scheme {kind!r}; use {SUPPORTED}")
    if legacy_endpoint:
        if uri.scheme != "gs":
            raise StoreUriError(f"{LEGACY_ENDPOINT_KEY} applies to a gs:// store, not {text!r}")
        if uri.endpoint and uri.endpoint != _endpoint(legacy_endpoint, text):
            raise StoreUriError(
                f"object store {text!r} names another endpoint than {legacy_endpoint!r}"
            )
        uri = StoreUri("gs", uri.where, uri.prefix, _endpoint(legacy_endpoint, text))
    return uri


def _parse_file(text: str) -> StoreUri:
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise StoreUriError(f"object store {text!r}: a file URI is file:///<absolute path>")
    return _file(unquote(parts.path), text)


def _file(path: str, text: str) -> StoreUri:
    pure = PurePosixPath(path)
    if not pure.is_absolute() or ".." in pure.parts:
        raise StoreUriError(f"object store {text!r}: the directory must be an absolute path")
    return StoreUri("file", str(pure))


def _gs(bucket: str, prefix: str, query: str, text: str) -> StoreUri:
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise StoreUriError(f"object store {text!r}: {bucket!r} is not a valid bucket name")
    fields = _query(query, ("endpoint",), text)
    return StoreUri("gs", bucket, _prefix(prefix, text), _endpoint(fields["endpoint"], text))


def _s3(bucket: str, prefix: str, query: str, text: str) -> StoreUri:
    if not _S3_BUCKET.fullmatch(bucket) or ".." in bucket or _IPV4.fullmatch(bucket):
        raise StoreUriError(f"object store {text!r}: {bucket!r} is not a valid S3 bucket name")
    fields = _query(query, ("endpoint", "region"), text)
    region = fields["region"]
    if region and not _REGION.fullmatch(region):
        raise StoreUriError(f"object store {text!r}: {region!r} is not a region name")
    endpoint = _endpoint(fields["endpoint"], text)
    return StoreUri("s3", bucket, _prefix(prefix, text), endpoint, region)


def _prefix(prefix: str, text: str) -> str:
    if prefix and any(p in ("", ".", "..") or p.startswith(".") for p in prefix.split("/")):
        raise StoreUriError(f"object store {text!r}: invalid prefix {prefix!r}")
    return prefix


def _query(query: str, names: tuple[str, ...], text: str) -> dict[str, str]:
    """The query's fields: each of ``names`` at most once and not empty ('' where absent)."""
    try:
        fields = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        fields = [("", "")]  # a malformed query is refused below like an unknown field
    found = dict(fields)
    if len(found) < len(fields) or not set(found) <= set(names) or "" in found.values():
        allowed = " and ".join(f"'{name}'" for name in names)
        raise StoreUriError(
            f"object store {text!r}: the query fields are {allowed}, each once and not empty"
        )
    return {name: found.get(name, "") for name in names}


def _endpoint(url: str, text: str) -> str:
    """An emulator's base URL, ``http(s)://host[:port]``, without a trailing slash ('' for '')."""
    if not url:
        return ""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError as exc:
        raise StoreUriError(f"object store {text!r}: endpoint {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise StoreUriError(f"object store {text!r}: endpoint {url!r} is not http(s)://host[:port]")
    if parts.path.strip("/") or parts.fragment or not _NETLOC.fullmatch(parts.netloc):
        raise StoreUriError(f"object store {text!r}: endpoint {url!r} is not http(s)://host[:port]")
    return f"{parts.scheme}://{parts.netloc}"
