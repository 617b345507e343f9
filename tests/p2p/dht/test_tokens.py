"""Write tokens: bound to the asker's address, valid for one rotation of grace."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from p2p.dht._errors import DhtUsageError
from p2p.dht._tokens import TOKEN_BYTES, TokenIssuer

SEED = b"\x07" * 32
PERIOD = 60.0
T0 = 1000.0

hosts = st.ip_addresses(v=4).map(str) | st.ip_addresses(v=6).filter(
    lambda ip: ip.ipv4_mapped is None
).map(str)
ports = st.integers(1, 65535)


def issuer(seed: bytes = SEED, now: float = T0) -> TokenIssuer:
    return TokenIssuer(seed, rotate_every_s=PERIOD, now=now)


def test_a_token_is_16_bytes_and_valid_for_its_address():
    tokens = issuer()
    token = tokens.issue("192.0.2.1", 4000, T0)
    assert len(token) == TOKEN_BYTES == 16
    assert tokens.check(token, "192.0.2.1", 4000, T0 + 1)


def test_a_token_stays_valid_through_one_rotation_and_dies_at_the_second():
    tokens = issuer()
    token = tokens.issue("192.0.2.1", 4000, T0)
    assert tokens.check(token, "192.0.2.1", 4000, T0 + PERIOD - 0.001)
    assert tokens.check(token, "192.0.2.1", 4000, T0 + PERIOD)  # previous secret
    assert tokens.check(token, "192.0.2.1", 4000, T0 + 2 * PERIOD - 0.001)
    assert not tokens.check(token, "192.0.2.1", 4000, T0 + 2 * PERIOD)
    assert tokens.rotation == 2


def test_a_long_silence_skips_rotations_and_invalidates_old_tokens():
    tokens = issuer()
    token = tokens.issue("192.0.2.1", 4000, T0)
    assert not tokens.check(token, "192.0.2.1", 4000, T0 + 10 * PERIOD + 5)
    assert tokens.rotation == 10
    assert tokens.next_rotation_at == T0 + 11 * PERIOD
    fresh = tokens.issue("192.0.2.1", 4000, T0 + 10 * PERIOD + 5)
    assert tokens.check(fresh, "192.0.2.1", 4000, T0 + 11 * PERIOD)


def test_an_explicit_rotation_keeps_one_rotation_of_grace():
    tokens = issuer()
    token = tokens.issue("192.0.2.1", 4000, T0)
    tokens.rotate(T0 + 1)
    assert tokens.check(token, "192.0.2.1", 4000, T0 + 2)
    tokens.rotate(T0 + 3)
    assert not tokens.check(token, "192.0.2.1", 4000, T0 + 4)
    assert tokens.next_rotation_at == T0 + 3 + PERIOD


def test_time_going_backwards_does_not_bring_old_secrets_back():
    tokens = issuer()
    token = tokens.issue("192.0.2.1", 4000, T0)
    tokens.issue("192.0.2.1", 4000, T0 + 3 * PERIOD)
    assert not tokens.check(token, "192.0.2.1", 4000, T0)
    assert tokens.rotation == 3


@given(hosts, ports, hosts, ports)
def test_a_token_is_invalid_for_any_other_host_or_port(host, port, other_host, other_port):
    assume((host, port) != (other_host, other_port))
    tokens = issuer()
    token = tokens.issue(host, port, T0)
    assert tokens.check(token, host, port, T0)
    assert not tokens.check(token, other_host, other_port, T0)


def test_a_token_is_bound_to_the_port_not_only_the_ip_unlike_upstream():
    tokens = issuer()
    token = tokens.issue("192.0.2.1", 4000, T0)
    assert not tokens.check(token, "192.0.2.1", 4001, T0)


def test_an_ipv4_mapped_ipv6_source_gets_the_same_token_as_its_ipv4_form():
    tokens = issuer()
    assert tokens.issue("::ffff:192.0.2.1", 4000, T0) == tokens.issue("192.0.2.1", 4000, T0)


@given(st.binary(min_size=16, max_size=64), hosts, ports, st.integers(0, 50))
def test_tokens_are_deterministic_from_the_seed(seed, host, port, periods):
    now = T0 + periods * PERIOD
    first = issuer(seed).issue(host, port, now)
    second = issuer(seed).issue(host, port, now)
    assert first == second
    other_seed = bytes([seed[0] ^ 1]) + seed[1:]
    assert issuer(other_seed).issue(host, port, now) != first


def test_another_issuers_tokens_are_invalid():
    token = issuer(b"\x01" * 32).issue("192.0.2.1", 4000, T0)
    assert not issuer(b"\x02" * 32).check(token, "192.0.2.1", 4000, T0)
    random_a = TokenIssuer.with_random_seed(now=T0)
    random_b = TokenIssuer.with_random_seed(now=T0)
    assert random_a.issue("192.0.2.1", 4000, T0) != random_b.issue("192.0.2.1", 4000, T0)


_garbage = st.none() | st.integers() | st.text(max_size=20) | st.binary(max_size=20) | st.floats()


@given(_garbage | st.binary(min_size=16, max_size=16), _garbage | hosts, _garbage | ports)
def test_checking_garbage_returns_false_and_never_raises(token, host, port):
    assert issuer().check(token, host, port, T0) is False


@pytest.mark.parametrize("seed", [b"", b"\x00" * 15, b"\x00" * 65, "a" * 32])
def test_a_seed_of_the_wrong_size_or_type_is_refused(seed):
    with pytest.raises(DhtUsageError) as caught:
        TokenIssuer(seed, now=T0)
    assert caught.value.code == "BAD_SECRET"


@pytest.mark.parametrize("period", [0, -1, float("inf"), float("nan")])
def test_a_rotation_period_that_is_not_positive_and_finite_is_refused(period):
    with pytest.raises(DhtUsageError):
        TokenIssuer(SEED, rotate_every_s=period, now=T0)


def test_issuing_for_a_host_name_is_a_usage_error():
    with pytest.raises(DhtUsageError) as caught:
        issuer().issue("example.com", 80, T0)
    assert caught.value.code == "BAD_ADDRESS"
