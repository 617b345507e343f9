"""The balancer, I/O-free: round robin over healthy replicas, back-off after failures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.proxy_inference.replicas import Balancer

A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def balancer(*keys: bytes, connected: bool = True, **kwargs) -> Balancer:
    bal = Balancer(**kwargs)
    bal.set_endpoints("j", keys)
    if connected:
        for key in keys:
            bal.connected(key)
    return bal


def test_requests_alternate_between_two_replicas():
    bal = balancer(A, B)
    assert [bal.pick("j", 0.0) for _ in range(6)] == [A, B, A, B, A, B]


def test_round_robin_covers_every_replica_evenly():
    bal = balancer(A, B, C)
    picks = [bal.pick("j", 0.0) for _ in range(300)]
    assert {key: picks.count(key) for key in (A, B, C)} == {A: 100, B: 100, C: 100}


def test_an_unknown_job_or_no_connected_replica_gives_nothing():
    bal = balancer(A, B, connected=False)
    assert bal.pick("j", 0.0) is None
    assert bal.pick("other", 0.0) is None
    bal.connected(B)
    assert bal.pick("j", 0.0) == B


def test_a_retry_excludes_the_replica_already_tried():
    bal = balancer(A, B)
    first = bal.pick("j", 0.0)
    assert bal.pick("j", 0.0, exclude=[first]) != first
    assert bal.pick("j", 0.0, exclude=[A, B]) is None


def test_a_failed_replica_is_skipped_during_its_backoff_then_comes_back():
    bal = balancer(A, B, backoff_s=1.0, backoff_max_s=8.0)
    assert bal.failed(A, 10.0) == 11.0
    assert [bal.pick("j", 10.5) for _ in range(4)] == [B, B, B, B]
    assert bal.healthy("j", 10.5) == 1
    assert {bal.pick("j", 11.0) for _ in range(4)} == {A, B}


def test_backoff_doubles_on_failures_in_a_row_and_a_success_resets_it():
    bal = balancer(A, B, backoff_s=1.0, backoff_max_s=4.0)
    assert [bal.failed(A, 0.0) for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    bal.succeeded(A)
    assert bal.state(A).failures == 0
    assert bal.failed(A, 0.0) == 1.0


def test_when_every_replica_is_in_backoff_the_one_ending_first_is_still_offered():
    bal = balancer(A, B, backoff_s=1.0)
    bal.failed(A, 0.0)
    bal.failed(A, 0.0)  # until 2.0
    bal.failed(B, 0.0)  # until 1.0
    assert bal.pick("j", 0.5) == B
    assert bal.pick("j", 0.5, exclude=[B]) == A


def test_a_disconnected_replica_is_not_picked_until_it_reconnects():
    bal = balancer(A, B)
    bal.disconnected(A)
    assert {bal.pick("j", 0.0) for _ in range(4)} == {B}
    bal.connected(A)
    assert {bal.pick("j", 0.0) for _ in range(4)} == {A, B}


def test_forgetting_a_job_or_an_agent_drops_it():
    bal = balancer(A, B)
    bal.forget_agent(A)
    assert {bal.pick("j", 0.0) for _ in range(4)} == {B}
    bal.forget_job("j")
    assert bal.pick("j", 0.0) is None and bal.jobs() == []


def test_bad_backoff_settings_are_refused():
    with pytest.raises(ValueError):
        Balancer(backoff_s=2.0, backoff_max_s=1.0)


@given(st.lists(st.tuples(st.sampled_from("pfsdc"), st.sampled_from([A, B, C]),
                          st.floats(0, 100)), max_size=60))
def test_a_pick_is_always_a_connected_endpoint_not_excluded(steps):
    bal = balancer(A, B, connected=False)
    for action, key, now in steps:
        if action == "p":
            picked = bal.pick("j", now, exclude=[key])
            if picked is not None:
                assert picked in (A, B) and picked != key
                assert bal.state(picked).connected
        elif action == "f":
            bal.failed(key, now)
        elif action == "s":
            bal.succeeded(key)
        elif action == "d":
            bal.disconnected(key)
        else:
            bal.connected(key)
