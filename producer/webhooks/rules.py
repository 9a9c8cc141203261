"""Webhook rules shared by the client (checked at submit) and the workers (checked again at
delivery): which URLs a job may notify, and how deliveries are signed.

Light on purpose (stdlib only): the client imports it, and so can a receiver that verifies
signatures.

**Where a job may send.** ``FRAMEFLEET_WEBHOOK_SCHEMES`` (default ``https``) and
``FRAMEFLEET_WEBHOOK_HOSTS``, a comma-separated list of entries (``producer/webhooks/hosts.py``):

- ``scheme://host[:port][/path]``: that scheme, host and port (none: the scheme's default), and
  only paths under ``/path`` (compared segment-wise after decoding once and resolving dot
  segments). ``host`` is a name, ``*.suffix``, an IP (``[::1]``) or a network in brackets
  (``http://[10.0.0.0/8]:8080/hooks``).
- ``host``, ``*.suffix``, an IP or a CIDR network alone: a **host-only** entry, which allows any
  path but only the default port of an allowed scheme (443 for https, 80 for http). Listing
  ``127.0.0.1/32`` does not open 127.0.0.1:6379 or :9333; say ``http://127.0.0.1:8080/hooks``.
- An empty list admits any host name and public IP, on the scheme's default port only.

Hosts are read as a connection would read them first (``2852039166``, ``0xa9fea9fe``,
``0251.0376.0251.0376`` and ``127.1`` are IPv4 addresses; ``::ffff:a.b.c.d`` is its IPv4
address), so the client refuses them at submit. Whatever the list, an address that is not
public (private, loopback, link-local such as the 169.254.169.254 metadata service,
carrier-grade NAT, multicast, reserved) is refused unless it lies inside the network of an
entry that allows the URL's scheme, port and path; workers apply that rule to every address a
name resolves to, then connect to the address they checked (no second lookup: DNS rebinding
cannot swap it), and send the path they checked.

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

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.webhooks.hosts import (
    DEFAULT_PORTS,
    Address,
    Entry,
    HostError,
    Network,
    normalise_host,
    normalise_path,
    parse_entries,
    quote_path,
    under,
    url_parts,
)

SIGNATURE_HEADER = "X-Framefleet-Signature"
TIMESTAMP_HEADER = "X-Framefleet-Timestamp"
EVENT_HEADER = "X-Framefleet-Event"
DELIVERY_HEADER = "X-Framefleet-Delivery"
#: The event's own id: the same whichever run of the job sends it (a job's end, a segment, a
#: preview step), so a receiver deduplicates on it across redeliveries.
EVENT_ID_HEADER = "X-Framefleet-Event-Id"
#: How old a signed timestamp :func:`verify` accepts by default (Stripe's choice too).
TOLERANCE_S = 300
MAX_URL_CHARS = 2048

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
    """The IPv4 address an IPv6 one stands for (mapped ::ffff:a.b.c.d, NAT64, 6to4 or
    Teredo's client), if any."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr in _NAT64:
            return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
        if addr.sixtofour is not None:
            return addr.sixtofour
        if addr.teredo is not None:
            return addr.teredo[1]
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
    host: str  # normalised: a name, or an address's canonical text
    port: int
    path: str  # path (normalised, re-encoded) and query: what goes on the request line
    #: Networks where this URL's addresses may be non-public: those of the entries that allow
    #: its scheme, port and path.
    networks: tuple[Network, ...] = ()

    @property
    def receiver(self) -> tuple[str, str, int]:
        """(scheme, host, port): deliveries to one receiver go one at a time, in order."""
        return self.scheme, self.host, self.port


HOSTS_VAR = "FRAMEFLEET_WEBHOOK_HOSTS"


class UrlPolicy:
    """The fleet's allow-list (see the module docstring)."""

    def __init__(self, schemes: str, hosts: str) -> None:
        self.schemes = set(_split(schemes))
        try:
            self.entries = parse_entries(hosts)
        except HostError as e:  # the settings check this too; a policy made by hand may not
            raise InvalidJobError(f"{HOSTS_VAR}: {e}") from None
        self.listed = bool(self.entries)

    @classmethod
    def from_settings(cls, settings: Settings) -> UrlPolicy:
        return cls(settings.webhook_schemes, settings.webhook_hosts)

    def check_address(self, addr: Address, field: str, target: Target | None = None) -> None:
        """Raise unless ``addr`` is public or inside a network of an entry that allows
        ``target``'s scheme, port and path (every listed network without a target)."""
        networks = target.networks if target is not None else tuple(
            e.network for e in self.entries if e.network is not None)
        v4 = _embedded_v4(addr)
        if any(addr in net or (v4 is not None and v4 in net) for net in networks):
            return
        if not is_public(addr):
            raise InvalidJobError(
                f"{field}: address {addr} is not public (private, loopback, link-local or "
                f"metadata) and not in a {HOSTS_VAR} entry for this port and path"
            )

    def _matching(self, scheme: str, port: int, path: str) -> list[Entry]:
        return [e for e in self.entries if e.scheme in (None, scheme)
                and e.allows_port(scheme, port) and under(path, e.path)]

    def _refuse(self, field: str, scheme: str, host: str, address: Address | None,
                port: int, path: str) -> InvalidJobError:
        """The message for a URL no entry allows: what its nearest entry does allow."""
        hosts = [e for e in self.entries if e.host_matches(host, address)]
        if not hosts:
            return InvalidJobError(f"{field}: host {host} not in {HOSTS_VAR}")
        schemed = [e for e in hosts if e.scheme in (None, scheme)]
        if not schemed:
            return InvalidJobError(f"{field}: {host}: no {HOSTS_VAR} entry allows {scheme}")
        ported = [e for e in schemed if e.allows_port(scheme, port)]
        if not ported:
            allowed = "; ".join(e.describe_port(scheme) for e in schemed)
            return InvalidJobError(
                f"{field}: port {port} of {host} not allowed ({HOSTS_VAR}: {allowed}; "
                f"list {scheme}://{host}:{port}/path to allow a port and path)")
        prefixes = "; ".join(f"{e.text!r} allows paths under {e.path}" for e in ported)
        return InvalidJobError(f"{field}: path {path} of {host}:{port} not allowed "
                               f"({HOSTS_VAR}: {prefixes})")

    def check_url(self, url: str, field: str) -> Target:
        """Parse ``url`` and apply every rule that needs no DNS; raise naming ``field``."""
        if len(url) > MAX_URL_CHARS:
            raise InvalidJobError(f"{field}: URL longer than {MAX_URL_CHARS} characters")
        try:
            scheme, raw_host, port, raw_path, query = url_parts(url)
            if scheme in self.schemes:
                host, address = normalise_host(raw_host)
                path = normalise_path(raw_path)
        except HostError as e:
            raise InvalidJobError(f"{field}: {e}") from None
        if scheme not in self.schemes:
            raise InvalidJobError(
                f"{field}: scheme {scheme or '(none)'!r} not allowed "
                f"(FRAMEFLEET_WEBHOOK_SCHEMES: {', '.join(sorted(self.schemes)) or 'none'})"
            )
        port = port or DEFAULT_PORTS[scheme]
        line = quote_path(path) + ("?" + query if query else "")
        if not self.listed:
            if port != DEFAULT_PORTS[scheme]:
                raise InvalidJobError(
                    f"{field}: port {port} not allowed: with {HOSTS_VAR} empty, webhooks go to "
                    f"public addresses on {scheme}'s port {DEFAULT_PORTS[scheme]} only")
            target = Target(url, scheme, host, port, line)
        else:
            allowing = self._matching(scheme, port, path)
            if not any(e.host_matches(host, address) for e in allowing):
                raise self._refuse(field, scheme, host, address, port, path)
            networks = tuple(e.network for e in allowing if e.network is not None)
            target = Target(url, scheme, host, port, line, networks)
        if host == "localhost" or host.endswith(".localhost"):  # loopback by definition
            address = ipaddress.ip_address("127.0.0.1")
        if address is not None:
            self.check_address(address, field, target)
        return target


def check_notify(urls: tuple[str, ...], policy: UrlPolicy) -> list[Target]:
    """Every ``notify.urls[i]`` checked; the first refused one raises, naming its index."""
    return [policy.check_url(url, f"notify.urls[{i}]") for i, url in enumerate(urls)]
