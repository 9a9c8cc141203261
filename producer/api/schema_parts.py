"""Pieces of the request schemas: the pydantic models' own schemas written in place, the URIs
a key may name, the webhook URLs the fleet's allow-list lets through.

Each pattern (ECMA-262, as JSON Schema reads them) says a subset of what the gateway takes that
holds every ordinary value (a name of letters, digits, ``.``, ``_`` and ``-``, not starting
with a dot), and nothing the gateway refuses. What it leaves out (a percent-encoded name, a
query string) the gateway still takes: a client that sends only what the schema says is never
refused for it.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel

from producer.api.files import NAME_RE
from producer.settings import Settings
from producer.webhooks.hosts import DEFAULT_PORTS, Entry
from producer.webhooks.rules import MAX_URL_CHARS, UrlPolicy

#: One path segment or file name: never ``.`` or ``..``, nothing to decode.
SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}"
#: One label of a host name, as ``producer.webhooks.hosts`` reads it; the last one of a name
#: does not look like a number.
LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
LAST_LABEL = r"[a-z_]([a-z0-9_-]{0,61}[a-z0-9_])?"
NULL: dict[str, Any] = {"type": "null"}
#: A public id (``producer.api.registry.valid_public_id``: no ``..`` anywhere), at most
#: ``PUBLIC_ID_CHARS`` characters.
PUBLIC_ID = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?$"
PUBLIC_ID_CHARS = 100
#: An id in a path: its form said in the schema only. The route answers any other with the
#: one 404 of an id that names nothing (unknown, another key's and malformed alike: no oracle).
PathId = Annotated[str, Path(json_schema_extra={"pattern": PUBLIC_ID,
                                                "maxLength": PUBLIC_ID_CHARS})]
#: A job's file (``producer.api.files.NAME_RE``), the same way.
FileName = Annotated[str, Path(json_schema_extra={"pattern": NAME_RE.pattern})]


def literal(text: str) -> str:
    """``text`` as a pattern that matches it and nothing else."""
    return "".join("\\" + c if c in ".^$*+?()[]{}|\\/" else c for c in text)


def inlined(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its ``$defs`` written in place: a ``#/$defs/…`` reference
    would point at the root of the OpenAPI document, where there are none."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(defs[ref.removeprefix("#/$defs/")])
            # a discriminator's mapping names the $defs too: the oneOf says the same
            return {k: walk(v) for k, v in node.items() if k not in ("title", "discriminator")}
        return [walk(v) for v in node] if isinstance(node, list) else node
    return dict(walk(schema))


def or_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, NULL]}


def uri_under(root: str, suffix: str = "") -> dict[str, Any]:
    """An ``s3://`` object strictly under ``root`` (a key's input prefix), its name ending in
    ``suffix``."""
    last = SEGMENT if not suffix else r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,115}" + literal(suffix)
    return {"type": "string", "maxLength": 2048,
            "pattern": f"^{literal(root.rstrip('/'))}(/{SEGMENT})*/{last}$",
            "description": f"an object under {root.rstrip('/')}/"}


def _host(entry: Entry) -> str | None:
    if entry.network is not None:  # one address is a host; a whole network is no pattern
        if entry.network.num_addresses != 1:
            return None
        address = entry.network.network_address
        return f"\\[{address}\\]" if isinstance(address, ipaddress.IPv6Address) \
            else literal(str(address))
    if entry.name is None:
        return None
    if entry.name.startswith("*."):
        return f"({LABEL}\\.)+{literal(entry.name[2:])}"
    return literal(entry.name)


def _url(entry: Entry, scheme: str) -> str | None:
    host = _host(entry)
    if host is None:
        return None
    port = entry.port if entry.port is not None else DEFAULT_PORTS[scheme]
    ports = f"(:{port})?" if port == DEFAULT_PORTS[scheme] else f":{port}"
    base = entry.path.rstrip("/")
    path = f"{literal(base)}(/{SEGMENT})*" + ("/?" if not base else "")
    return f"{scheme}://{host}{ports}{path}"


def _public(scheme: str) -> str:
    """Any host name but localhost's, on the scheme's port: an empty allow-list's URLs (an
    address is judged public or not, which no pattern says: none is listed here)."""
    return (f"{scheme}://(?!([^/:]*\\.)?localhost(:|/|$))({LABEL}\\.)*{LAST_LABEL}"
            f"(:{DEFAULT_PORTS[scheme]})?(/{SEGMENT})*/?")


def webhook_url(settings: Settings) -> dict[str, Any] | None:
    """A URL the fleet's allow-list lets through (``FRAMEFLEET_WEBHOOK_HOSTS``; empty: public
    hosts on the default port), or None when it lets none through."""
    policy = UrlPolicy.from_settings(settings)
    schemes = sorted(policy.schemes & set(DEFAULT_PORTS))
    if not policy.listed:
        urls = [_public(scheme) for scheme in schemes]
    else:
        urls = [url for e in policy.entries for scheme in schemes
                if e.scheme in (None, scheme) and (url := _url(e, scheme)) is not None]
    if not urls:
        return None
    return {"type": "string", "maxLength": MAX_URL_CHARS,
            "pattern": "^(" + "|".join(urls) + ")$",
            "description": "a URL that FRAMEFLEET_WEBHOOK_HOSTS allows"}
