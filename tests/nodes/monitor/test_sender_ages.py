"""wrk-monitor lists its metrics senders in ``service.status`` (``metrics_sender_ages``):
every key whose report it took, fresh or silent, the newest first, with the seconds
since its last report; the listing's format parses back (hypothesis) and anything
else is a ValueError naming the entry, never another exception."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from contracts.health import MAX_DETAILS, STATUS, StatusRequest
from contracts.monitor import (
    MAX_LISTED_SENDERS,
    METRICS_PUSH,
    SENDER_AGES,
    MetricsReport,
    parse_sender_ages,
    sender_ages_detail,
)
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService

from .support import connect

PROXY = b"\x01" * 32
OTHER_PROXY = b"\xab" * 32
READER = b"\x03" * 32


async def test_status_lists_every_sender_with_its_age_newest_first(nursery, autojump_clock):
    service = MonitorService(LogBuffer(), proxies=[PROXY, OTHER_PROXY], followers=[READER],
                             clock=trio.current_time)
    async with (connect(nursery, service, PROXY) as proxy,
                connect(nursery, service, OTHER_PROXY) as other,
                connect(nursery, service, READER) as reader):
        with trio.fail_after(600):
            status = await reader.call(STATUS, StatusRequest())
            assert status.details[SENDER_AGES] == ""  # nobody reported yet
            await proxy.call(METRICS_PUSH, MetricsReport(window_s=60))
            await trio.sleep(10)
            await other.call(METRICS_PUSH, MetricsReport(window_s=60))
            await trio.sleep(2)
            status = await reader.call(STATUS, StatusRequest())
            assert parse_sender_ages(status.details[SENDER_AGES]) == [
                ("abababababababab", pytest.approx(2.0, abs=0.1)),
                ("0101010101010101", pytest.approx(12.0, abs=0.1))]
            # The first reports again: it moves to the front. Silent for longer
            # than the book's staleness, the other is still listed (not counted).
            await trio.sleep(60)
            await proxy.call(METRICS_PUSH, MetricsReport(window_s=60))
            status = await reader.call(STATUS, StatusRequest())
            assert parse_sender_ages(status.details[SENDER_AGES]) == [
                ("0101010101010101", pytest.approx(0.0, abs=0.1)),
                ("abababababababab", pytest.approx(62.0, abs=0.1))]
            assert status.details["metrics_senders"] == 1
            assert len(status.details) <= MAX_DETAILS


def test_the_listing_is_bounded_and_parses_back():
    ages = [(bytes([i]) * 32, i * 1.25) for i in range(MAX_LISTED_SENDERS + 10)]
    text = sender_ages_detail(ages)
    parsed = parse_sender_ages(text)
    assert len(parsed) == MAX_LISTED_SENDERS and len(text) < 1600
    assert parsed[1] == ("0101010101010101", 1.2)  # one decimal
    assert parse_sender_ages("") == []


@pytest.mark.parametrize("text", [
    "0101010101010101", "010101010101010:1.0", "01010101010101010:1.0", "zz01010101010101:1",
    "0101010101010101:x", "0101010101010101:-1", "0101010101010101:nan",
    "0101010101010101:inf", "0101010101010101:1.0,", "0101010101010101:1.0,,",
    "0101010101010101:1," * (MAX_LISTED_SENDERS + 1), "ABABABABABABABAB:1"])
def test_a_bad_listing_is_a_value_error(text):
    with pytest.raises(ValueError):
        parse_sender_ages(text)


@given(st.lists(st.tuples(st.binary(min_size=32, max_size=32),
                          st.floats(min_value=0, max_value=1e9)), max_size=80))
def test_any_listing_parses_back(ages):
    parsed = parse_sender_ages(sender_ages_detail(ages))
    assert [key for key, _ in parsed] == [k.hex()[:16] for k, _ in ages[:MAX_LISTED_SENDERS]]
    assert all(abs(age - a) <= 0.05 + a * 1e-12 for (_, age), (_, a) in zip(
        parsed, ages, strict=False))


@given(st.text(max_size=200))
def test_any_text_parses_or_is_a_value_error(text):
    try:
        parsed = parse_sender_ages(text)
    except ValueError:
        return
    assert all(len(key) == 16 and 0 <= age < 1e12 for key, age in parsed)
