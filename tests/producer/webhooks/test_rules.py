"""The webhook allow-list as the client applies it at submit (no network, no DNS)."""

from __future__ import annotations

import ipaddress

import pytest

from producer.errors import InvalidJobError
from producer.webhooks.rules import UrlPolicy, check_notify


@pytest.mark.parametrize(("hosts", "url", "refused"), [
    # The empty list: any name or public IP, on the scheme's default port only
    ("", "https://hooks.example.com/x", None),
    ("", "https://8.8.8.8/x", None),
    ("", "https://hooks.example.com:443/x", None),
    ("", "http://hooks.example.com/x", "scheme 'http' not allowed"),
    ("", "https://hooks.example.com:8443/x", "port 8443 not allowed: with FRAMEFLEET_WEBHOOK_"
     "HOSTS empty, webhooks go to public addresses on https's port 443 only"),
    ("", "https://169.254.169.254/latest/meta-data", "not public"),
    ("", "https://[fd00:ec2::254]/", "not public"),
    ("", "https://10.1.2.3/", "not public"),
    ("", "https://127.0.0.1/", "not public"),
    ("", "https://[::ffff:127.0.0.1]/", "not public"),
    ("", "https://[::ffff:7f00:1]/", "address 127.0.0.1 is not public"),
    ("", "https://[2002:7f00:1::]/", "not public"),  # 6to4 of 127.0.0.1
    ("", "https://100.64.0.1/", "not public"),
    ("", "https://localhost/", "not public"),
    ("", "https://user:pw@hooks.example.com/", "credentials"),
    ("", "https://hooks.example.com/#frag", "fragments"),
    # Numeric host forms are the address they stand for
    ("", "https://2852039166/", "address 169.254.169.254 is not public"),
    ("", "https://0xa9fea9fe/", "address 169.254.169.254 is not public"),
    ("", "https://0251.0376.0251.0376/", "address 169.254.169.254 is not public"),
    ("", "https://127.1/", "address 127.0.0.1 is not public"),
    ("", "https://017700000001/", "address 127.0.0.1 is not public"),
    ("", "https://1.2.3.4.5/", "not an IPv4 address"),
    ("", "https://%31%32%37.0.0.1/", "percent"),
    # Host-only entries: the default port of the scheme, any path
    ("*.example.com", "https://a.hooks.example.com/", None),
    ("*.example.com", "https://example.com.evil.net/", "not in FRAMEFLEET_WEBHOOK_HOSTS"),
    ("hooks.example.com", "https://other.example.com/", "not in FRAMEFLEET_WEBHOOK_HOSTS"),
    ("hooks.example.com,10.0.0.0/8", "https://10.1.2.3/any/path", None),
    ("127.0.0.1", "https://127.0.0.1/", None),
    ("127.0.0.1", "https://0x7f000001/", None),
    ("127.0.0.1", "https://127.0.0.2/", "not in FRAMEFLEET_WEBHOOK_HOSTS"),
    ("127.0.0.1/32", "https://127.0.0.1:9333/vol/grow?count=1",
     r"port 9333 of 127\.0\.0\.1 not allowed \(FRAMEFLEET_WEBHOOK_HOSTS: '127\.0\.0\.1/32' "
     r"is host-only: https's default port 443 only; list https://127\.0\.0\.1:9333/path"),
    ("127.0.0.1/32", "https://127.1:6379/", "port 6379 of 127.0.0.1 not allowed"),
    ("127.0.0.1/32", "https://2130706433:6379/", "port 6379 of 127.0.0.1 not allowed"),
    ("hooks.example.com", "https://hooks.example.com:8443/", "is host-only"),
    # Entries with a port and a path prefix
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1:8443/hooks", None),
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1:8443/hooks/", None),
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1:8443/hooks/a?b=c", None),
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1:8443/hooksx", "path /hooksx"),
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1:8443/hooks/../vol/grow",
     "path /vol/grow of 127.0.0.1:8443 not allowed"),
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1:8443/hooks/%2e%2e/vol/grow",
     "path /vol/grow of"),
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1:8443/hooks/%252e%252e/x", "twice"),
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1:8444/hooks",
     "port 8444 of 127.0.0.1 not allowed .*'https://127.0.0.1:8443/hooks' allows port 8443"),
    ("https://127.0.0.1:8443/hooks", "https://127.0.0.1/hooks", "port 443 of"),
    ("http://127.0.0.1:8443/hooks", "https://127.0.0.1:8443/hooks", "no FRAMEFLEET_WEBHOOK_"
     "HOSTS entry allows https"),
    ("https://[10.0.0.0/8]:8080/in", "https://10.9.8.7:8080/in/x", None),
    ("https://[10.0.0.0/8]:8080/in", "https://10.9.8.7:8081/in/x", "port 8081"),
    ("https://*.example.com:8443/in", "https://a.example.com:8443/in", None),
    ("https://*.example.com:8443/in", "https://a.example.com/in", "port 443"),
    ("https://[::1]:9000", "https://[::1]:9000/", None),
    ("https://[::1]:9000", "https://[0:0::1]:9000/", None),
])
def test_allow_list(hosts: str, url: str, refused: str | None) -> None:
    policy = UrlPolicy("https", hosts)
    if refused is None:
        assert policy.check_url(url, "notify.urls[0]").url == url
    else:
        with pytest.raises(InvalidJobError, match=rf"^notify\.urls\[0\]: .*{refused}"):
            policy.check_url(url, "notify.urls[0]")


def test_the_target_carries_what_was_checked() -> None:
    policy = UrlPolicy("http", "http://[127.0.0.0/8]:8080/hooks, 10.0.0.0/8")
    target = policy.check_url("http://0x7f.1:8080/hooks/a/%2e%2e/b%20c?x=1&y", "f")
    # The canonical host, and the path as it was judged (decoded once, resolved, re-encoded)
    assert (target.host, target.port, target.path) == ("127.0.0.1", 8080, "/hooks/b%20c?x=1&y")
    assert target.receiver == ("http", "127.0.0.1", 8080)
    # Only the networks of the entries that allow this port and path may hold its addresses
    assert target.networks == (ipaddress.ip_network("127.0.0.0/8"),)
    policy.check_address(ipaddress.ip_address("127.0.0.9"), "f", target)
    with pytest.raises(InvalidJobError, match="address 10.0.0.1 is not public"):
        policy.check_address(ipaddress.ip_address("10.0.0.1"), "f", target)


def test_a_name_that_resolves_inside_a_network_for_another_port_is_refused() -> None:
    """A listed name whose DNS answers 127.0.0.1 gets no loopback through a network entry
    that allows another port."""
    policy = UrlPolicy("https", "hooks.example.com, https://[127.0.0.0/8]:8443/hooks")
    target = policy.check_url("https://hooks.example.com/x", "f")
    assert target.networks == ()
    with pytest.raises(InvalidJobError, match="127.0.0.1 is not public"):
        policy.check_address(ipaddress.ip_address("127.0.0.1"), "f", target)


def test_the_refused_url_is_named_by_its_index() -> None:
    policy = UrlPolicy("https", "")
    with pytest.raises(InvalidJobError, match=r"notify\.urls\[1\]: address 192\.168\.0\.7"):
        check_notify(("https://hooks.example.com/", "https://192.168.0.7/"), policy)
    with pytest.raises(InvalidJobError, match=r"notify\.urls\[2\]: address 169\.254\.169\.254"):
        check_notify(("https://a.example.com/", "https://b.example.com/",
                      "https://2852039166/"), policy)


def test_receivers_import_verify_from_the_package() -> None:
    # producer.webhooks.verify is the name the README gives receivers; it loads rules on use
    from producer.webhooks import rules, verify

    assert verify is rules.verify
