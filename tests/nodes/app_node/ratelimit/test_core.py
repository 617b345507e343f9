"""The GCRA core: bursts, long-run rate, retry-after and LRU bounds (no clock, no I/O)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.app_node.ratelimit import Decision, GcraTable, Rate
from tests.examples import examples

rates = st.builds(Rate, per_second=st.floats(0.01, 1000.0), burst=st.integers(1, 200))


@given(rate=rates, now=st.floats(0, 1e6), extra=st.integers(1, 50))
def test_never_more_than_burst_at_one_instant(rate: Rate, now: float, extra: int) -> None:
    table = GcraTable()
    decisions = [table.check("k", rate, now) for _ in range(rate.burst + extra)]
    allowed = [d for d in decisions if d.allowed]
    assert len(allowed) == rate.burst
    # The burst comes first, counting down to 0; then every refusal says when.
    assert all(d.allowed for d in decisions[: rate.burst])
    assert [d.remaining for d in allowed] == list(range(rate.burst - 1, -1, -1))
    for refused in decisions[rate.burst:]:
        assert refused.retry_after_s == rate.interval_us / 1e6
        assert int(refused.retry_after_header) >= 1


@settings(max_examples=examples(200))
@given(rate=rates, gaps=st.lists(st.floats(0, 5.0), min_size=1, max_size=300))
def test_long_run_rate_bounded(rate: Rate, gaps: list[float]) -> None:
    """In any window [a, b] of requests, at most burst + rate·(b - a) are allowed."""
    table = GcraTable()
    now, times = 0.0, []
    for gap in gaps:
        now += gap
        if table.check("k", rate, now).allowed:
            times.append(now)
    for i in range(len(times)):
        for j in range(i, len(times)):
            window = times[j] - times[i]
            assert j - i + 1 <= rate.burst + (window + 2e-6) / (rate.interval_us / 1e6)


@given(rate=rates, now=st.floats(0, 1e6))
def test_retry_after_is_exact(rate: Rate, now: float) -> None:
    """Waiting exactly retry_after_s is enough, and no earlier time would do."""
    table = GcraTable()
    for _ in range(rate.burst):
        table.check("k", rate, now)
    refused = table.check("k", rate, now)
    assert not refused.allowed
    assert table.check("k", rate, now + refused.retry_after_s).allowed


def test_idle_key_gets_its_burst_back() -> None:
    rate = Rate(per_second=2.0, burst=3)
    table = GcraTable()
    assert [table.check("k", rate, 0.0).allowed for _ in range(4)] == [True] * 3 + [False]
    assert table.check("k", rate, 0.5).allowed  # one interval later: one more
    assert not table.check("k", rate, 0.5).allowed
    fresh = [table.check("k", rate, 10.0) for _ in range(4)]
    assert [d.allowed for d in fresh] == [True] * 3 + [False]


def test_keys_are_independent_and_bounded_by_lru() -> None:
    rate = Rate(per_second=1.0, burst=1)
    table = GcraTable(max_keys=2)
    assert table.check("a", rate, 0.0).allowed
    assert table.check("b", rate, 0.0).allowed
    assert not table.check("a", rate, 0.0).allowed  # "a" now most recently used
    assert table.check("c", rate, 0.0).allowed  # evicts "b", the least recently used
    assert len(table) == 2 and table.evictions == 1
    assert not table.check("a", rate, 0.0).allowed  # still remembered
    assert table.check("b", rate, 0.0).allowed  # forgotten: a fresh burst


def test_retry_after_header_rounds_up() -> None:
    assert Decision(False, 0.2, 0).retry_after_header == "1"
    assert Decision(False, 1.0, 0).retry_after_header == "1"
    assert Decision(False, 1.01, 0).retry_after_header == "2"
    assert Decision(False, 0.0, 0).retry_after_header == "1"
    assert math.ceil(59.5) == int(Decision(False, 59.5, 0).retry_after_header)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Rate(per_second=0, burst=1)
    with pytest.raises(ValueError):
        Rate(per_second=1, burst=0)
    with pytest.raises(ValueError, match="max_keys"):
        GcraTable(max_keys=0)
