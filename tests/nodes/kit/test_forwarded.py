"""X-Forwarded-For read and written hop by hop, trusting only the proxies named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.kit.forwarded import TrustedProxies, client_address, forwarded_for

TRUSTED = TrustedProxies(["127.0.0.1", "10.0.0.0/8", "fd00::/8"])


@pytest.mark.parametrize(("peer", "header", "client", "sent_on"), [
    # a client straight in: its own header is never believed, never passed on
    ("192.0.2.1", ["6.6.6.6"], "192.0.2.1", "192.0.2.1"),
    ("192.0.2.1", [], "192.0.2.1", "192.0.2.1"),
    # through one trusted proxy
    ("127.0.0.1", ["192.0.2.1"], "192.0.2.1", "192.0.2.1, 127.0.0.1"),
    # the client's forgery left of what our proxy wrote
    ("127.0.0.1", ["6.6.6.6, 192.0.2.1"], "192.0.2.1", "192.0.2.1, 127.0.0.1"),
    # two of our proxies
    ("127.0.0.1", ["6.6.6.6, 192.0.2.1, 10.1.2.3"], "192.0.2.1",
     "192.0.2.1, 10.1.2.3, 127.0.0.1"),
    # several header lines are one list
    ("10.0.0.9", ["6.6.6.6", "192.0.2.1"], "192.0.2.1", "192.0.2.1, 10.0.0.9"),
    # all trusted: the leftmost
    ("127.0.0.1", ["10.0.0.3"], "10.0.0.3", "10.0.0.3, 127.0.0.1"),
    # garbage ends the walk at the last trusted hop
    ("127.0.0.1", ["192.0.2.1, junk"], "127.0.0.1", "127.0.0.1"),
    ("127.0.0.1", ["192.0.2.1:4000"], "127.0.0.1", "127.0.0.1"),
    # IPv6, and IPv4 mapped into IPv6
    ("fd00::1", ["2001:db8::5"], "2001:db8::5", "2001:db8::5, fd00::1"),
    ("::ffff:127.0.0.1", ["192.0.2.1"], "192.0.2.1", "192.0.2.1, 127.0.0.1"),
    (None, ["192.0.2.1"], None, None),
])
def test_the_client_and_what_is_sent_on(peer, header, client, sent_on) -> None:
    assert client_address(peer, header, TRUSTED) == client
    assert forwarded_for(peer, [h.encode() for h in header], TRUSTED) == sent_on


def test_nothing_trusted_means_the_peer() -> None:
    assert client_address("127.0.0.1", ["192.0.2.1"], TrustedProxies()) == "127.0.0.1"


def test_a_bad_entry_is_named() -> None:
    with pytest.raises(ValueError, match=r"'10\.0\.0\.300'"):
        TrustedProxies(["10.0.0.300"])


_ip = st.ip_addresses(v=4).map(str)


@given(st.lists(_ip, max_size=6), _ip)
def test_an_untrusted_peer_is_always_the_client(header, peer) -> None:
    trusted = TrustedProxies(["10.0.0.0/8"])
    if peer.startswith("10."):
        return
    assert client_address(peer, [", ".join(header)], trusted) == peer


@given(st.lists(_ip, max_size=6), _ip)
def test_the_client_is_never_a_trusted_proxy_unless_all_are(header, client) -> None:
    trusted = TrustedProxies(["10.0.0.0/8"])
    chain = [*header, client, "10.0.0.1"]
    found = client_address("10.0.0.2", [", ".join(chain)], trusted)
    if not client.startswith("10."):
        assert found == client  # whatever the client wrote to its left


@pytest.mark.parametrize(("value", "parsed"), [
    ("127.0.0.1", ("127.0.0.1",)),
    ("127.0.0.1, 10.0.0.0/8", ("127.0.0.1", "10.0.0.0/8")),
    ('["::1", "fd00::/8"]', ("::1", "fd00::/8")),
    ("", ()),
])
def test_trusted_proxies_from_the_environment(monkeypatch, value, parsed) -> None:
    from nodes.app_node.settings import AppNodeSettings
    from nodes.entry import EntrySettings

    monkeypatch.setenv("COSMICAC_APP_NODE__LIMITS__TRUSTED_PROXIES", value)
    monkeypatch.setenv("COSMICAC_ENTRY__TRUSTED_PROXIES", value)
    assert AppNodeSettings(storage="/nonexistent").limits.trusted_proxies == parsed
    assert EntrySettings().trusted_proxies == parsed


def test_a_bad_trusted_proxy_setting_names_the_key_and_the_entry(monkeypatch) -> None:
    from pydantic import ValidationError

    from nodes.app_node.settings import AppNodeSettings

    monkeypatch.setenv("COSMICAC_APP_NODE__LIMITS__TRUSTED_PROXIES", "127.0.0.1,door")
    with pytest.raises(ValidationError, match=r"(?s)limits\.trusted_proxies.*'door'"):
        AppNodeSettings(storage="/nonexistent")
