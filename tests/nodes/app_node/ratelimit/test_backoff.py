"""The failure throttle's core, sans-IO: time is a float the test moves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.app_node.ratelimit import Backoff, BackoffTable, Throttle, ThrottlePolicy
from tests.examples import examples

POLICY = Backoff(free_failures=2, base_s=1.0, max_s=8.0, forget_s=100.0)


@pytest.mark.parametrize(("failures", "wait"), [
    (1, 0.0), (2, 0.0), (3, 1.0), (4, 2.0), (5, 4.0), (6, 8.0), (7, 8.0), (200, 8.0),
])
def test_the_wait_doubles_past_the_free_failures_up_to_the_cap(failures: int,
                                                               wait: float) -> None:
    table = BackoffTable()
    for _ in range(failures):
        table.failed("k", POLICY, 0.0)
    assert table.wait_s("k", POLICY, 0.0) == wait


def test_failures_are_forgotten_and_reset() -> None:
    table = BackoffTable()
    for _ in range(5):
        table.failed("k", POLICY, 0.0)
    assert table.wait_s("k", POLICY, 3.9) == pytest.approx(0.1)
    assert table.wait_s("k", POLICY, 100.0) == 0.0 and len(table) == 0  # forgotten
    for _ in range(5):
        table.failed("k", POLICY, 200.0)
    table.reset("k")
    assert table.wait_s("k", POLICY, 200.0) == 0.0


def test_the_table_is_bounded() -> None:
    table = BackoffTable(max_keys=3)
    for i in range(10):
        table.failed(f"k{i}", POLICY, 0.0)
    assert len(table) == 3 and table.evictions == 7


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


THROTTLE = ThrottlePolicy(per_source=POLICY,
                          per_account=Backoff(free_failures=4, base_s=1.0, max_s=60.0))


def test_keys_per_account_and_source() -> None:
    throttle = Throttle(THROTTLE, Clock())
    for _ in range(3):
        throttle.failed("a@example.com", "192.0.2.1")
    assert throttle.wait_s("A@Example.com ", "192.0.2.1") == 1.0  # one account, normalised
    assert throttle.wait_s("a@example.com", "192.0.2.2") == 0.0  # another source
    assert throttle.wait_s("b@example.com", "192.0.2.1") == 0.0  # another account
    # emails are kept as digests only
    assert not any("example" in key for key in throttle._failures._entries)


def test_no_ceiling_when_the_policy_names_none() -> None:
    throttle = Throttle(ThrottlePolicy(per_source=POLICY, per_account=None), Clock())
    for i in range(100):
        throttle.failed("", f"192.0.2.{i}")
    assert throttle.wait_s("", "198.51.100.1") == 0.0


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.floats(0, 30)), max_size=60))
def test_no_stranger_can_hold_back_a_source_that_succeeded(attacks) -> None:
    """Any failures from any other sources, at any times: the user's known
    address may always try at once."""
    clock = Clock()
    throttle = Throttle(THROTTLE, clock)
    throttle.succeeded("user@example.com", "198.51.100.7")
    for source, step in attacks:
        clock.now += step
        throttle.failed("user@example.com", f"192.0.2.{source}")
        assert throttle.wait_s("user@example.com", "198.51.100.7") == 0.0


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.floats(0, 30), min_size=1, max_size=60))
def test_a_stranger_never_waits_beyond_the_ceilings_cap(steps) -> None:
    """However an account is attacked, a new address waits at most the ceiling's max_s."""
    clock = Clock()
    throttle = Throttle(THROTTLE, clock)
    for i, step in enumerate(steps):
        clock.now += step
        throttle.failed("user@example.com", f"192.0.2.{i}")
    assert throttle.wait_s("user@example.com", "203.0.113.1") <= 60.0 + 1e-6
