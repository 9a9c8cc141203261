"""How a webhook URL's host, port and path are read before the allow-list judges them, and the
allow-list's entries (``FRAMEFLEET_WEBHOOK_HOSTS``) themselves.

Stdlib only: the client, the settings and the workers import it.

**Hosts are read the way the connecting code would read them.** ``getaddrinfo`` (glibc's
``inet_aton``) and browsers (the WHATWG URL standard) take ``2852039166``, ``0xa9fea9fe``,
``0251.0376.0251.0376`` and ``127.1`` as IPv4 addresses. :func:`normalise_host` turns every such
form into its dotted quad first, so the client judges the address a worker would connect to
(and refuses it at submit, not after DNS on a worker). A host whose last label is numeric but
that is no valid address (``1.2.3.4.5``, ``0x1g``, ``example.123``) is refused, as browsers do;
so are non-ASCII names (give the ``xn--`` form), percent-encoded hosts, and IPv6 zone ids.

**Paths are compared as the receiver will read them**: decoded once, dot segments resolved
(:func:`normalise_path`). A path that still holds a percent sign after that one decoding
(double encoding), a backslash, a control character or a dot segment with parameters
(``..;``) is refused rather than guessed at.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"https": 443, "http": 80}
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_NUMERIC_PART = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_LOOKS_NUMERIC = re.compile(r"^(0x[0-9a-z]*|[0-9][0-9a-z]*)$")
#: What the request line keeps unencoded: RFC 3986 pchar and "/".
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


class HostError(ValueError):
    """A host, path or allow-list entry that cannot be read safely; the text says why."""


def _ipv4_part(part: str) -> int:
    """One part of an IPv4 form: 0x-prefixed hex, 0-prefixed octal, or decimal."""
    if part.startswith("0x"):
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        if not part.isdigit() or "8" in part or "9" in part:
            raise HostError(f"{part!r} is not an octal number")
        return int(part, 8)
    return int(part)


def _ipv4_form(host: str) -> ipaddress.IPv4Address:
    """``inet_aton``'s reading of 1 to 4 numeric parts (the last one fills the rest)."""
    parts = host.split(".")
    if len(parts) > 4 or not all(_NUMERIC_PART.match(p) for p in parts):
        raise HostError(f"host {host!r} ends in a number but is not an IPv4 address")
    numbers = [_ipv4_part(p) for p in parts]
    last_bits = 8 * (5 - len(numbers))
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 1 << last_bits:
        raise HostError(f"host {host!r} is an IPv4 form out of range")
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value |= n << (24 - 8 * i)
    return ipaddress.IPv4Address(value)


def normalise_host(host: str) -> tuple[str, Address | None]:
    """The host as a connection would read it: (canonical text, address if it is one).

    ``host`` is ``urlsplit(url).hostname`` (brackets removed, lower case)."""
    if not host:
        raise HostError("URL has no host")
    if not host.isascii():
        raise HostError(f"host {host!r} is not ASCII (give its xn-- form)")
    if "%" in host:
        raise HostError(f"host {host!r} has a percent sign (an encoding or an IPv6 zone id)")
    if ":" in host:
        try:
            v6 = ipaddress.IPv6Address(host)
        except ValueError:
            raise HostError(f"host {host!r} is not an IPv6 address") from None
        return (str(v6.ipv4_mapped), v6.ipv4_mapped) if v6.ipv4_mapped else (str(v6), v6)
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if _LOOKS_NUMERIC.match(labels[-1]):
        v4 = _ipv4_form(name)
        return str(v4), v4
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise HostError(f"host {host!r} is not a valid host name")
    return name, None


def normalise_path(path: str) -> str:
    """``path`` decoded once, dot segments resolved, as the receiver will read it (see the
    module docstring for what is refused). Always starts with ``/``."""
    decoded = unquote(path or "/", errors="strict")
    if "%" in decoded:
        raise HostError(f"path {path!r} is encoded twice")
    if "\\" in decoded or any(ord(c) < 0x20 or ord(c) == 0x7F for c in decoded):
        raise HostError(f"path {path!r} has a backslash or a control character")
    out: list[str] = []
    segments = decoded.split("/")[1:] if decoded.startswith("/") else decoded.split("/")
    for segment in segments:
        if segment.split(";", 1)[0] in (".", "..") and ";" in segment:
            raise HostError(f"path {path!r} has a dot segment with parameters")
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    result = "/" + "/".join(out)
    return result + "/" if out and segments[-1] in (".", "..") else result


def quote_path(path: str) -> str:
    """A normalised path as it goes on the request line."""
    return quote(path, safe=_PATH_SAFE)


def under(path: str, prefix: str) -> bool:
    """True if normalised ``path`` is ``prefix`` or below it (segment-wise)."""
    base = prefix.rstrip("/")
    return not base or path == base or path.startswith(base + "/")


@dataclass(frozen=True)
class Entry:
    """One allow-list entry. ``scheme`` None: any allowed scheme; ``port`` None: the scheme's
    default port (443 for https, 80 for http); ``path`` ``/``: any path."""

    text: str
    scheme: str | None
    name: str | None  # a host name, or "*.suffix"
    network: Network | None
    port: int | None
    path: str

    @property
    def host_only(self) -> bool:
        return self.scheme is None

    def host_matches(self, host: str, address: Address | None) -> bool:
        if self.network is not None:
            return address is not None and address in self.network
        if address is not None or self.name is None:
            return False
        if self.name.startswith("*."):
            return host.endswith(self.name[1:]) and len(host) > len(self.name) - 1
        return host == self.name

    def allows_port(self, scheme: str, port: int) -> bool:
        return port == (self.port if self.port is not None else DEFAULT_PORTS[scheme])

    def describe_port(self, scheme: str) -> str:
        """What this entry allows of ``scheme``'s ports, for a refusal's message."""
        if self.port is not None:
            return f"{self.text!r} allows port {self.port}"
        kind = "is host-only" if self.host_only else "names no port"
        return f"{self.text!r} {kind}: {scheme}'s default port {DEFAULT_PORTS[scheme]} only"


def _host_part(text: str, value: str) -> tuple[str | None, Network | None]:
    """(name, None) or (None, network) of an entry's host (an IP is a /32 or /128)."""
    try:
        return None, ipaddress.ip_network(value, strict=False)
    except ValueError:
        pass
    if value.startswith("*."):
        name, address = normalise_host(value[2:])
        if address is not None:
            raise HostError(f"entry {text!r}: a wildcard needs a name suffix")
        return "*." + name, None
    try:
        name, address = normalise_host(value)
    except HostError as e:
        raise HostError(f"entry {text!r}: {e}") from None
    if address is not None:  # a numeric form such as 127.1
        return None, ipaddress.ip_network(address)
    return name, None


def parse_entry(text: str) -> Entry:
    """One ``FRAMEFLEET_WEBHOOK_HOSTS`` entry: ``host``, ``*.suffix``, an IP, a CIDR network
    (host-only), or ``scheme://host[:port][/path]`` where host may be ``[v6]`` or a network
    in brackets (``[10.0.0.0/8]``)."""
    text = text.strip()
    if "://" not in text:
        if text.count(":") == 1 or re.search(r"/\D", text):
            raise HostError(f"entry {text!r}: a port or a path needs the "
                            "scheme://host[:port][/path] form")
        name, network = _host_part(text, text.lower())
        return Entry(text, None, name, network, None, "/")
    match = re.fullmatch(r"(https?)://(\[[^\]]+\]|[^/:@\[\]]+)(?::(\d{1,5}))?(/[^?#]*)?",
                         text, re.IGNORECASE)
    if match is None:
        raise HostError(f"entry {text!r} is not scheme://host[:port][/path] "
                        "(http or https, no query, no credentials)")
    scheme, host, port, path = match.groups()
    name, network = _host_part(text, host.strip("[]").lower())
    number = int(port) if port else None
    if number is not None and not 0 < number < 65536:
        raise HostError(f"entry {text!r}: port {number} out of range")
    try:
        prefix = normalise_path(path or "/")
    except HostError as e:
        raise HostError(f"entry {text!r}: {e}") from None
    return Entry(text, scheme.lower(), name, network, number, prefix)


def parse_entries(value: str) -> list[Entry]:
    """Every entry of a comma-separated ``FRAMEFLEET_WEBHOOK_HOSTS``."""
    return [parse_entry(item) for item in value.split(",") if item.strip()]


def url_parts(url: str) -> tuple[str, str, int | None, str, str]:
    """(scheme, host, port, path, query) of ``url`` as urlsplit reads them; raises
    HostError for what is no URL, carries credentials or a fragment."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise HostError(f"not a URL: {e}") from None
    if parts.username is not None or parts.password is not None:
        raise HostError("credentials in the URL are not allowed")
    if parts.fragment:
        raise HostError("URL fragments are not allowed")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in parts.query):
        raise HostError("URL query has a space or a control character")
    return parts.scheme.lower(), (parts.hostname or "").lower(), port, parts.path, parts.query
