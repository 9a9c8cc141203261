"""The base of every wire model (``producer.wire.spec``, ``producer.wire.results``): frozen, and
no field it does not know (a typo is an error, not a silently ignored setting); and the one
reading of a URI a spec names (``check_uri`` is re-exported by ``producer.wire.spec``).

A URI is percent-decoded exactly once, here, into the :class:`Location` the stores use (the
scheme, the bucket, the decoded path or key); every check (the spec's validators, the file
roots, the output prefix, the gateway's tenant prefixes) and every store (``file://`` and
``s3://`` sinks, latents, images, weights, the ledger) works on that one form, so what is
checked is what is opened. Refused, in any position, with a message naming the field:

- ``.`` and ``..`` segments, and empty ones (``//``; one trailing ``/`` is allowed);
- encoded separators (``%2F``, ``%2f``, ``%5C``), and ``\\`` itself;
- control characters (``%00`` or a raw NUL, newline, tab, DEL …), raw or encoded;
- a query or a fragment (``?``, ``#``, raw or encoded), and ``%`` left after the one decode:
  ``%252e`` decodes to the literal ``%2e``, which is refused rather than kept as a name,
  so no later reader can decode it a second time into ``..``;
- bytes that do not decode as UTF-8;
- for ``s3://``: a bucket that is not ``[A-Za-z0-9][A-Za-z0-9._-]*``, and a key that starts
  with ``/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict

#: The version of ``JobSpec`` and ``Manifest``.
SCHEMA_VERSION: Literal[1] = 1

#: Control characters (C0 and DEL): never in a URI, raw or encoded.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Encoded separators: ``a%2F..%2Fb`` must not become ``a/../b`` after the checks.
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
#: What a decoded path or key may not hold besides controls: a separator of another system,
#: and the characters that would make it read differently when parsed or decoded again.
_UNSAFE = re.compile(r"[\\%?#]")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")


class Frozen(BaseModel):
    """What a producer sends (the job spec): a field this fleet does not know is an error
    naming it, not a setting silently dropped."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Reported(BaseModel):
    """What a worker reports (progress, results, manifests, the ledger): a field this reader
    does not know is left out, so that clients and gateways of the release before read what
    the workers of the next one write while a fleet is upgraded worker by worker."""

    model_config = ConfigDict(frozen=True, extra="ignore")


@dataclass(frozen=True)
class Location:
    """A URI in the form the store uses, decoded once and checked (``decode_uri``).

    ``path`` is the decoded absolute path for ``file://`` and the decoded object key (no
    leading ``/``; empty for the bucket's root) for ``s3://``; ``bucket`` is empty for
    ``file://``. ``uri`` is the URI as sent, for messages.
    """

    scheme: Literal["s3", "file"]
    bucket: str
    path: str
    uri: str

    @property
    def parts(self) -> tuple[str, ...]:
        """The path's segments (no empty ones: a trailing ``/`` names the same place)."""
        return tuple(p for p in self.path.split("/") if p)

    @property
    def key(self) -> str:
        """The S3 key, or the file path without its leading ``/`` (relative to ``/``)."""
        return "/".join(self.parts)

    def within(self, prefix: Location, *, strict: bool = False) -> bool:
        """Whether this names ``prefix`` or a place under it, segment by segment, in the same
        store (``strict``: under it, not the prefix itself)."""
        if (self.scheme, self.bucket) != (prefix.scheme, prefix.bucket):
            return False
        mine, theirs = self.parts, prefix.parts
        if strict and len(mine) <= len(theirs):
            return False
        return mine[:len(theirs)] == theirs


def _refuse(field: str, value: str, why: str) -> ValueError:
    return ValueError(f"{field}: {why}: {value!r}")


def decode_uri(value: str, *, field: str) -> Location:
    """Parse and percent-decode ``value`` once into a :class:`Location`, or raise
    ``ValueError`` naming ``field`` (the module's docstring lists what is refused).

    Accepts ``s3://bucket/key`` and ``file:///absolute/path`` (``file://localhost/…``)."""
    scheme, sep, rest = value.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("s3", "file"):
        hint = " (a local path is written file:///absolute/path)" if not sep else ""
        raise ValueError(f"{field}: scheme must be s3:// or file://, got {value!r}{hint}")
    if _CONTROL.search(value):
        raise _refuse(field, value, "control characters (NUL, newline, tab …) are not allowed")
    if "?" in value or "#" in value:
        raise _refuse(field, value, "a query or fragment ('?', '#') is not allowed")
    if _ENCODED_SEPARATOR.search(value):
        raise _refuse(field, value, "encoded separators (%2F, %5C) are not allowed")
    netloc, slash, raw = rest.partition("/")
    try:
        path = unquote(slash + raw, errors="strict")
    except UnicodeDecodeError:
        raise _refuse(field, value, "percent escapes must decode as UTF-8") from None
    if _CONTROL.search(path):
        raise _refuse(field, value, "control characters (NUL, newline, tab …) are not allowed")
    if _UNSAFE.search(path):
        raise _refuse(field, value, "'\\', '%', '?' and '#' are not allowed in a name once "
                      "decoded (decoded once: %25 is a literal '%', refused)")
    if scheme == "s3":
        if not netloc:
            raise ValueError(f"{field}: s3 URI needs a bucket: {value!r}")
        if not _BUCKET.fullmatch(netloc):
            raise _refuse(field, value, "not a bucket name ([A-Za-z0-9][A-Za-z0-9._-]*)")
        path = path[1:]
        if path.startswith("/"):
            raise _refuse(field, value, "an S3 key may not start with '/'")
    elif netloc not in ("", "localhost") or not path.startswith("/"):
        raise ValueError(f"{field}: file URI must be absolute (file:///...): {value!r}")
    segments = path.split("/")[1:] if scheme == "file" else path.split("/")
    if path and "" in segments[:-1]:
        raise _refuse(field, value, "empty path segments ('//') are not allowed")
    if any(part in {"..", "."} for part in segments):
        raise _refuse(field, value, "'.' and '..' path segments are not allowed")
    if scheme == "s3":
        return Location("s3", netloc, path, value)
    return Location("file", "", path, value)


def check_uri(value: str, *, field: str) -> str:
    """Accept ``s3://bucket/key`` or ``file:///absolute/path`` that :func:`decode_uri`
    accepts (pydantic validators: a ``ValueError`` naming ``field``); returns ``value``."""
    decode_uri(value, field=field)
    return value
