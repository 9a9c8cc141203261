"""Webhook rules shared by the client (checked at submit) and the workers (checked again at
delivery): which URLs a job may notify, and how deliveries are signed.

Light on purpose (stdlib only): the client imports it, and so can a receiver that verifies
signatures.

**Where a job may send.** ``FRAMEFLEET_WEBHOOK_SCHEMES`` (default ``https``) and
``FRAMEFLEET_WEBHOOK_HOSTS``: host names (``hooks.example.com``), wildcard suffixes
(``*.example.com``), IP addresses or networks (``10.2.0.0/16``). An empty list admits any host
name. Whatever the list, an address that is not public (private, loopback, link-local such as
the 169.254.169.254 metadata service, carrier-grade NAT, multicast, reserved) is refused unless
it lies inside a listed network; workers apply that rule to every address a name resolves to,
then connect to the address they checked (no second lookup: DNS rebinding cannot swap it).

**Signature.** ``X-Framefleet-Signature: sha256=<hex>``, the HMAC-SHA256 keyed with the fleet's
``FRAMEFLEET_WEBHOOK_SECRET`` over ``<timestamp>.<body>``, where ``<timestamp>`` is the
``X-Framefleet-Timestamp`` header (unix seconds). A receiver recomputes it with
:func:`verify` and rejects old timestamps, so a captured delivery cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from producer.errors import InvalidJobError
from producer.settings import Settings

SIGNATURE_HEADER = "X-Framefleet-Signature"
TIMESTAMP_HEADER = "X-Framefleet-Timestamp"
EVENT_HEADER = "X-Framefleet-Event"
DELIVERY_HEADER = "X-Framefleet-Delivery"
#: How old a signed timestamp :func:`verify` accepts by default (Stripe's choice too).
TOLERANCE_S = 300
MAX_URL_CHARS = 2048

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Framefleet-Signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(
    secret: str, timestamp: str, signed: str, body: bytes,
    tolerance_s: float = TOLERANCE_S, now: float | None = None,
) -> bool:
    """True if ``signed`` (the signature header) matches ``body`` and ``timestamp`` (the
    timestamp header) is within ``tolerance_s`` of ``now``. Constant-time comparison."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, ts, body), signed)


def _split(value: str) -> list[str]:
    return [item.strip().lower() for item in value.split(",") if item.strip()]


def _embedded_v4(addr: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped ::ffff:a.b.c.d or NAT64), if any."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr in _NAT64:
            return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def is_public(addr: Address) -> bool:
    """Routable on the internet: not private, loopback, link-local, CGNAT, multicast,
    reserved or unspecified (IPv6 forms of IPv4 addresses are judged as IPv4)."""
    v4 = _embedded_v4(addr)
    if v4 is not None:
        return is_public(v4)
    return addr.is_global and not (addr.is_multicast or addr.is_reserved)


@dataclass(frozen=True)
class Target:
    """A webhook URL taken apart: what a delivery connects to and what it sends."""

    url: str
    scheme: str
    host: str
    port: int
    path: str  # path and query, what goes on the request line


class UrlPolicy:
    """The fleet's allow-list (see the module docstring)."""

    def __init__(self, schemes: str, hosts: str) -> None:
        self.schemes = set(_split(schemes))
        self.names: list[str] = []
        self.networks: list[Network] = []
        for entry in _split(hosts):
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.names.append(entry)
        self.listed = bool(self.names or self.networks)

    @classmethod
    def from_settings(cls, settings: Settings) -> UrlPolicy:
        return cls(settings.webhook_schemes, settings.webhook_hosts)

    def _name_listed(self, host: str) -> bool:
        for name in self.names:
            if name.startswith("*."):
                if host.endswith(name[1:]) and len(host) > len(name) - 1:
                    return True
            elif host == name:
                return True
        return False

    def check_address(self, addr: Address, field: str) -> None:
        """Raise unless ``addr`` is public or inside a listed network."""
        if any(addr in net for net in self.networks):
            return
        v4 = _embedded_v4(addr)
        if v4 is not None and any(v4 in net for net in self.networks):
            return
        if not is_public(addr):
            raise InvalidJobError(
                f"{field}: address {addr} is not public (private, loopback, link-local or "
                "metadata) and not in FRAMEFLEET_WEBHOOK_HOSTS"
            )

    def check_url(self, url: str, field: str) -> Target:
        """Parse ``url`` and apply every rule that needs no DNS; raise naming ``field``."""
        if len(url) > MAX_URL_CHARS:
            raise InvalidJobError(f"{field}: URL longer than {MAX_URL_CHARS} characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise InvalidJobError(f"{field}: not a URL: {e}") from None
        scheme = parts.scheme.lower()
        if scheme not in self.schemes:
            raise InvalidJobError(
                f"{field}: scheme {scheme or '(none)'!r} not allowed "
                f"(FRAMEFLEET_WEBHOOK_SCHEMES: {', '.join(sorted(self.schemes)) or 'none'})"
            )
        host = (parts.hostname or "").lower()
        if not host:
            raise InvalidJobError(f"{field}: URL has no host")
        if parts.username is not None or parts.password is not None:
            raise InvalidJobError(f"{field}: credentials in the URL are not allowed")
        if parts.fragment:
            raise InvalidJobError(f"{field}: URL fragments are not allowed")
        try:
            literal: Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            if self.listed and not any(literal in net for net in self.networks):
                raise InvalidJobError(f"{field}: host {host} not in FRAMEFLEET_WEBHOOK_HOSTS")
            self.check_address(literal, field)
        else:
            if self.names and not self._name_listed(host):
                raise InvalidJobError(f"{field}: host {host} not in FRAMEFLEET_WEBHOOK_HOSTS")
            if self.networks and not self.names:
                raise InvalidJobError(
                    f"{field}: host {host}: FRAMEFLEET_WEBHOOK_HOSTS lists networks only"
                )
            if host == "localhost" or host.endswith(".localhost"):  # loopback by definition
                self.check_address(ipaddress.ip_address("127.0.0.1"), field)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return Target(url, scheme, host, port or (443 if scheme == "https" else 80), path)


def check_notify(urls: tuple[str, ...], policy: UrlPolicy) -> list[Target]:
    """Every ``notify.urls[i]`` checked; the first refused one raises, naming its index."""
    return [policy.check_url(url, f"notify.urls[{i}]") for i, url in enumerate(urls)]
