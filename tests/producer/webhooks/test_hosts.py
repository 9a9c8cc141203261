"""Reading hosts, paths and allow-list entries the way a connection would (no network)."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from producer.errors import SettingsError
from producer.settings import Settings
from producer.webhooks.hosts import HostError, normalise_host, normalise_path, parse_entry

METADATA = "169.254.169.254"


@pytest.mark.parametrize(("host", "canonical"), [
    ("2852039166", METADATA),  # decimal
    ("0xa9fea9fe", METADATA),  # hex
    ("0xA9FEA9FE".lower(), METADATA),
    ("0251.0376.0251.0376", METADATA),  # octal parts
    ("0xa9.0xfe.0xa9.0xfe", METADATA),
    ("169.254.43518", METADATA),  # the last part fills the rest
    ("169.16689662", METADATA),
    ("127.1", "127.0.0.1"),
    ("127.0.1", "127.0.0.1"),
    ("0", "0.0.0.0"),
    ("0x7f.1", "127.0.0.1"),
    ("017700000001", "127.0.0.1"),
    ("127.0.0.1.", "127.0.0.1"),  # a trailing dot
    ("::ffff:169.254.169.254", METADATA),  # v4-mapped, both spellings
    ("::ffff:a9fe:a9fe", METADATA),
    ("0:0:0:0:0:ffff:7f00:1", "127.0.0.1"),
    ("0000::1", "::1"),
    ("hooks.example.com", "hooks.example.com"),
    ("hooks.example.com.", "hooks.example.com"),
    ("a-1.b_2.example", "a-1.b_2.example"),
])
def test_numeric_forms_read_as_inet_aton_reads_them(host: str, canonical: str) -> None:
    name, address = normalise_host(host)
    assert name == canonical
    if address is not None:
        assert str(address) == canonical
    else:
        assert canonical == host.rstrip(".")


@pytest.mark.parametrize("host", [
    "2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "127.1", "0x7f.1", "169.254.43518",
])
def test_the_reading_agrees_with_the_c_library(host: str) -> None:
    """What the worker's getaddrinfo would connect to is what the client judged."""
    libc = socket.getaddrinfo(host, 80, type=socket.SOCK_STREAM)[0][4][0]
    assert normalise_host(host)[0] == libc


@pytest.mark.parametrize(("host", "why"), [
    ("1.2.3.4.5", "not an IPv4 address"),
    ("0x1g", "not an IPv4 address"),
    ("example.123", "not an IPv4 address"),
    ("08.1.1.1", "not an octal number"),
    ("256.1.1.1", "out of range"),
    ("1.2.3.256", "out of range"),
    ("4294967296", "out of range"),
    ("127.0.0.1%2e", "percent"),
    ("fe80::1%eth0", "percent"),
    ("bücher.example", "not ASCII"),
    ("exa mple.com", "not a valid host name"),
    ("-a.example.com", "not a valid host name"),
    ("", "no host"),
])
def test_hosts_that_cannot_be_read_safely_are_refused(host: str, why: str) -> None:
    with pytest.raises(HostError, match=why):
        normalise_host(host)


@pytest.mark.parametrize(("path", "normal"), [
    ("", "/"),
    ("/hooks", "/hooks"),
    ("/hooks/", "/hooks/"),
    ("/hooks/a/../b", "/hooks/b"),
    ("/hooks/%2e%2e/vol/grow", "/vol/grow"),  # decoded once, then resolved
    ("/hooks/%2E%2E/%2e%2e/../x", "/x"),
    ("/./a/./b/.", "/a/b/"),
    ("/a/b/..", "/a/"),
    ("/../../etc", "/etc"),
    ("/hooks%2fx", "/hooks/x"),
])
def test_paths_are_decoded_once_and_resolved(path: str, normal: str) -> None:
    assert normalise_path(path) == normal


@pytest.mark.parametrize(("path", "why"), [
    ("/hooks/%252e%252e/vol", "encoded twice"),
    ("/hooks\\..\\vol", "backslash"),
    ("/hooks/%5c../vol", "backslash"),
    ("/a/%0d%0aX: y", "control"),
    ("/hooks/..;/vol/grow", "dot segment with parameters"),
])
def test_paths_that_a_receiver_could_read_otherwise_are_refused(path: str, why: str) -> None:
    with pytest.raises(HostError, match=why):
        normalise_path(path)


@pytest.mark.parametrize(("text", "scheme", "host", "port", "path"), [
    ("hooks.example.com", None, "hooks.example.com", None, "/"),
    ("*.Example.com", None, "*.example.com", None, "/"),
    ("127.0.0.1", None, "127.0.0.1/32", None, "/"),
    ("127.0.0.1/32", None, "127.0.0.1/32", None, "/"),
    ("10.2.0.0/16", None, "10.2.0.0/16", None, "/"),
    ("::1", None, "::1/128", None, "/"),
    ("fd00::/8", None, "fd00::/8", None, "/"),
    ("127.1", None, "127.0.0.1/32", None, "/"),  # numeric forms read as addresses here too
    ("https://hooks.example.com", "https", "hooks.example.com", None, "/"),
    ("http://127.0.0.1:8080/hooks/", "http", "127.0.0.1/32", 8080, "/hooks/"),
    ("HTTP://[::1]:9000/a/./b", "http", "::1/128", 9000, "/a/b"),
    ("http://[10.0.0.0/8]:8080/hooks", "http", "10.0.0.0/8", 8080, "/hooks"),
    ("https://*.example.com:8443/in", "https", "*.example.com", 8443, "/in"),
])
def test_entries(text: str, scheme: str | None, host: str, port: int | None, path: str) -> None:
    entry = parse_entry(text)
    assert entry.scheme == scheme and entry.port == port and entry.path == path
    assert entry.host_only == (scheme is None)
    if "/" in host:
        assert entry.network == ipaddress.ip_network(host) and entry.name is None
    else:
        assert entry.name == host and entry.network is None


@pytest.mark.parametrize(("text", "why"), [
    ("127.0.0.1:9333", "needs the scheme://host"),
    ("hooks.example.com/path", "needs the scheme://host"),
    ("ftp://hooks.example.com", "is not scheme://host"),
    ("http://hooks.example.com/?q=1", "is not scheme://host"),
    ("http://user@hooks.example.com/", "is not scheme://host"),
    ("http://127.0.0.1:99999/", "out of range"),
    ("http://127.0.0.1/%252e", "encoded twice"),
    ("*.127.0.0.1", "wildcard needs a name"),
    ("1.2.3.4.5", "not an IPv4 address"),
])
def test_bad_entries_are_refused(text: str, why: str) -> None:
    with pytest.raises(HostError, match=why):
        parse_entry(text)


def test_a_bad_entry_stops_the_settings_naming_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"FRAMEFLEET_WEBHOOK_HOSTS=.*'127\.0\.0\.1:6379'.*"
                                            r"scheme://host\[:port\]"):
        Settings(webhook_hosts="hooks.example.com, 127.0.0.1:6379")
    assert Settings(webhook_hosts="http://127.0.0.1:8080/hooks, *.example.com").webhook_threads
