"""The client address behind trusted proxies and the key the per-address bounds count."""

from __future__ import annotations

import pytest

from codemode.service.peers import TrustedProxies, address_key


def _headers(**values: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in values.items()]


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"),  # same /64: one client
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("", ""),
        (None, ""),
    ],
)
def test_address_key(host: str | None, key: str) -> None:
    assert address_key(host) == key


def test_no_proxies_means_the_peer_is_the_client() -> None:
    proxies = TrustedProxies()
    assert not proxies
    assert proxies.client("127.0.0.1", _headers(x_forwarded_for="1.2.3.4")) == "127.0.0.1"


@pytest.mark.parametrize(
    ("peer", "xff", "client"),
    [
        ("10.0.0.5", "203.0.113.9", "203.0.113.9"),
        # Read from the right: the left entries are the client's to choose.
        ("10.0.0.5", "1.1.1.1, 203.0.113.9", "203.0.113.9"),
        # Proxies in a chain are skipped.
        ("10.0.0.5", "203.0.113.9, 10.0.0.7", "203.0.113.9"),
        ("10.0.0.5", "203.0.113.9:4711", "203.0.113.9"),
        ("10.0.0.5", "[2001:db8::1]:4711", "2001:db8::1"),
        # Garbage where an address should be: the proxy that wrote it.
        ("10.0.0.5", "unknown", "10.0.0.5"),
        ("10.0.0.5", "203.0.113.9, bogus, 10.0.0.7", "10.0.0.7"),
        # No header: the proxy itself.
        ("10.0.0.5", None, "10.0.0.5"),
        # Not a trusted proxy: its headers are ignored.
        ("192.0.2.1", "203.0.113.9", "192.0.2.1"),
    ],
)
def test_x_forwarded_for_from_trusted_proxies(peer: str, xff: str | None, client: str) -> None:
    proxies = TrustedProxies(["10.0.0.0/24"])
    headers = _headers(x_forwarded_for=xff) if xff is not None else []
    assert proxies.client(peer, headers + _headers(forwarded="for=198.51.100.1")) == client


def test_multiple_x_forwarded_for_headers_are_one_list() -> None:
    proxies = TrustedProxies(["10.0.0.5"])
    headers = _headers(x_forwarded_for="1.1.1.1") + _headers(x_forwarded_for="203.0.113.9")
    assert proxies.client("10.0.0.5", headers) == "203.0.113.9"


@pytest.mark.parametrize(
    ("forwarded", "client"),
    [
        ("for=203.0.113.9", "203.0.113.9"),
        ('for="[2001:db8::7]:4711";proto=https', "2001:db8::7"),
        ("for=1.1.1.1, for=203.0.113.9;by=10.0.0.5", "203.0.113.9"),
        ("FOR=203.0.113.9", "203.0.113.9"),
        ("for=_hidden", "10.0.0.5"),
        ("proto=https", "10.0.0.5"),
    ],
)
def test_forwarded_from_trusted_proxies(forwarded: str, client: str) -> None:
    proxies = TrustedProxies(["10.0.0.5"], header="forwarded")
    # X-Forwarded-For is not the header these proxies write: never read.
    headers = _headers(forwarded=forwarded, x_forwarded_for="198.51.100.1")
    assert proxies.client("10.0.0.5", headers) == client
