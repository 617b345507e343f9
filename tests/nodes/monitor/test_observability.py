"""The Loki in force, swapped at runtime (nodes/monitor/observability.py): records
offered after a swap reach the new Loki and the old one gets no more; what the old
pusher buffered is handed over, its batch in flight cut after the grace and counted;
a clear flushes to the old Loki; the same value again changes nothing; what app-node
sent is persisted and read back at start, a corrupt file ignored; app-node's clear
deletes the file and puts wrk-monitor's own settings (or no Loki) back. The RPC side:
observability.set/get/clear for followers only, bad URLs refused, credentials never
shown.

The holder's tests push to local Loki servers over real sockets (real time,
bounded waits); the RPC tests run in memory on the autojump clock."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest
import trio

from contracts.health import STATUS, StatusRequest
from contracts.monitor import (
    OBSERVABILITY_CLEAR,
    OBSERVABILITY_GET,
    OBSERVABILITY_SET,
    QUERY,
    Observability,
    ObservabilityClear,
    ObservabilityQuery,
    Query,
    decode_batch,
    make_record,
)
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.observability import (
    OBSERVABILITY_FILE,
    ObservabilityHolder,
    load_persisted,
)
from nodes.monitor.service import MonitorService
from p2p.rpc import RpcError
from tests.p2p.helpers import wait_until

from .loki_server import LokiServer, start_loki
from .support import READER, STRANGER, connect

#: Fast pushes and retries: the tests wait on real sockets.
FAST = {"flush_interval_s": 0.01, "backoff_initial_s": 0.02, "backoff_max_s": 0.05,
        "max_retries": 10_000}


def recs(start: int, n: int, job: str = "j-1"):
    return [make_record(f"line {i}", service="wrk-ork", job_id=job, time_ns=1_000 + i)
            for i in range(start, start + n)]


def lines(loki: LokiServer) -> list[str]:
    return sorted((line for _, _, line in loki.entries()), key=lambda s: int(s.split()[1]))


async def _holder(nursery: trio.Nursery, tmp_path, start: Observability | None,
                  **kw) -> ObservabilityHolder:
    holder = ObservabilityHolder(start, origin="settings" if start else "none",
                                 storage=tmp_path, pusher_options=FAST, **kw)
    await nursery.start(holder.run)
    return holder


async def test_after_a_swap_records_reach_the_new_loki_and_the_old_one_stops(tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            old, new = await start_loki(nursery), await start_loki(nursery)
            holder = await _holder(nursery, tmp_path, Observability(loki_url=old.url))
            first_reader = holder.reader
            holder.offer(recs(0, 3))
            await wait_until(lambda: len(old.entries()) == 3, limit_s=10)
            state = await holder.set(Observability(loki_url=new.url,
                                                   prometheus_url="http://prom:9090"))
            assert (state.loki, state.loki_url, state.origin, state.persisted) == (
                True, new.url, "app-node", True)
            assert holder.reader is not first_reader and holder.reader.url == new.url
            holder.offer(recs(3, 4))
            await wait_until(lambda: len(new.entries()) == 4, limit_s=10)
            await wait_until(lambda: not holder._retiring, limit_s=10)
            holder.offer(recs(7, 1))
            await wait_until(lambda: len(new.entries()) == 5, limit_s=10)
            assert lines(old) == ["line 0", "line 1", "line 2"]
            assert lines(new) == [f"line {i}" for i in range(3, 8)]
            # Loki stored the last push before the pusher read its answer: wait for it.
            await wait_until(lambda: holder.statistics().pushed == 8, limit_s=10)
            stats = holder.statistics()
            assert (stats.pushed, stats.dropped, stats.buffered) == (8, 0, 0)
            # The history reader follows the swap.
            got = await holder.reader.query_range("j-1", start_ns=0, end_ns=10**6)
            assert [r.line for r in got] == [f"line {i}" for i in range(3, 8)]
            nursery.cancel_scope.cancel()


async def test_buffered_records_are_handed_over_and_the_batch_in_flight_is_cut(tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            old, new = await start_loki(nursery), await start_loki(nursery)
            old.fail_next(100_000, status=503)  # the old Loki never takes anything
            holder = await _holder(nursery, tmp_path, Observability(loki_url=old.url),
                                   grace_s=0.3)
            holder.offer(recs(0, 1))
            await wait_until(lambda: len(old.pushes) >= 2, limit_s=10)  # in flight, retrying
            holder.offer(recs(1, 5))
            assert holder.statistics().buffered == 5
            await holder.set(Observability(loki_url=new.url))
            await wait_until(lambda: len(new.entries()) == 5, limit_s=10)
            assert lines(new) == [f"line {i}" for i in range(1, 6)]
            await wait_until(lambda: not holder._retiring, limit_s=10)
            await wait_until(lambda: holder.statistics().pushed == 5, limit_s=10)
            stats = holder.statistics()
            assert (stats.pushed, stats.dropped, stats.buffered) == (5, 1, 0)
            # A push the old pusher had sent when it was cut may still be read by the
            # old Loki (same loop, busy machine): count from after that, then watch
            # for as long as four of its retries (the old pusher is stopped).
            await trio.sleep(0.2)
            pushes = len(old.pushes)
            await trio.sleep(0.2)
            assert len(old.pushes) == pushes
            nursery.cancel_scope.cancel()


async def test_a_clear_flushes_to_the_old_loki_and_then_nothing_is_pushed(tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            loki = await start_loki(nursery)
            holder = await _holder(nursery, tmp_path, Observability(loki_url=loki.url))
            holder.offer(recs(0, 4))
            state = await holder.set(Observability())
            assert (state.loki, state.loki_url, holder.reader) == (False, None, None)
            holder.offer(recs(4, 2))  # no Loki now: not taken
            await wait_until(lambda: not holder._retiring, limit_s=10)
            assert lines(loki) == [f"line {i}" for i in range(4)]
            assert holder.statistics().pushed == 4
            nursery.cancel_scope.cancel()


async def test_the_same_loki_again_keeps_the_pusher_and_a_new_tenant_swaps_it(tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            loki = await start_loki(nursery)
            holder = await _holder(nursery, tmp_path, Observability(loki_url=loki.url))
            pusher = holder.pusher
            await holder.set(Observability(loki_url=loki.url))
            await holder.set(Observability(loki_url=loki.url, prometheus_url="http://p:9090"))
            assert holder.pusher is pusher and holder.swaps == 0
            assert holder.state().prometheus_url == "http://p:9090"
            await holder.set(Observability(loki_url=loki.url, loki_tenant="team-a"))
            assert holder.pusher is not pusher and holder.swaps == 1
            holder.offer(recs(0, 2))
            await wait_until(lambda: len(loki.entries("team-a")) == 2, limit_s=10)
            assert loki.entries() == []
            nursery.cancel_scope.cancel()


async def test_what_app_node_sent_is_read_back_at_start_over_the_settings(tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            loki = await start_loki(nursery)
            sent = Observability(loki_url=loki.url.replace("//", "//u:pw@"), loki_tenant="t",
                                 prometheus_url="http://prom:9090")
            holder = await _holder(nursery, tmp_path, None)
            await holder.set(sent)
            path = tmp_path / OBSERVABILITY_FILE
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            # No temporary file is left beside it.
            assert [p.name for p in tmp_path.iterdir() if OBSERVABILITY_FILE in p.name] == [
                OBSERVABILITY_FILE]
            # A restart: the file wins over the settings' Loki.
            again = ObservabilityHolder.from_storage(
                tmp_path, settings_url="http://other:3100", settings_tenant=None,
                pusher_options=FAST)
            assert again.value == sent  # credentials included: the restart needs them
            assert (again.state().origin, again.state().persisted) == ("file", True)
            await nursery.start(again.run)
            again.offer(recs(0, 1))
            await wait_until(lambda: len(loki.entries("t")) == 1, limit_s=10)
            nursery.cancel_scope.cancel()


async def test_app_nodes_clear_puts_the_settings_back_and_deletes_the_file(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nodes.monitor.observability")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            own, sent = await start_loki(nursery), await start_loki(nursery)
            path = tmp_path / OBSERVABILITY_FILE
            holder = ObservabilityHolder.from_storage(tmp_path, settings_url=own.url,
                                                      settings_tenant="ops",
                                                      pusher_options=FAST)
            await nursery.start(holder.run)
            # Nothing sent yet: a clear changes nothing and says nothing.
            state = await holder.clear()
            assert (state.loki_url, state.loki_tenant, state.origin) == (own.url, "ops",
                                                                         "settings")
            assert holder.swaps == 0 and "monitor.observability" not in caplog.text
            await holder.set(Observability(loki_url=sent.url, prometheus_url="http://p:9090"))
            assert path.exists()
            holder.offer(recs(0, 2))
            state = await holder.clear()
            assert (state.loki, state.loki_url, state.loki_tenant, state.prometheus_url,
                    state.origin, state.persisted) == (True, own.url, "ops", None,
                                                       "settings", False)
            assert not path.exists()
            holder.offer(recs(2, 1))
            own_lines = lambda: [line for _, _, line in own.entries("ops")]  # noqa: E731
            await wait_until(lambda: "line 2" in own_lines(), limit_s=10)
            await wait_until(lambda: not holder._retiring, limit_s=10)
            # What the app-node Loki still buffered went over to the settings' one
            # (a swap's hand-over); each record once, the newest only there.
            assert sorted(lines(sent) + own_lines()) == ["line 0", "line 1", "line 2"]
            assert "monitor.observability.cleared by=app-node" in caplog.text
            # A restart reads no file: the settings again.
            again = ObservabilityHolder.from_storage(tmp_path, settings_url=own.url,
                                                     settings_tenant="ops")
            assert (again.state().origin, again.state().loki_url) == ("settings", own.url)
            nursery.cancel_scope.cancel()


async def test_a_clear_without_settings_stops_pushing(tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            loki = await start_loki(nursery)
            await _holder(nursery, tmp_path, None)  # persists nothing itself
            holder = ObservabilityHolder.from_storage(tmp_path, settings_url=None,
                                                      settings_tenant=None, pusher_options=FAST)
            await nursery.start(holder.run)
            await holder.set(Observability(loki_url=loki.url))
            holder.offer(recs(0, 3))
            state = await holder.clear()
            assert (state.loki, state.loki_url, state.origin, holder.pusher) == (
                False, None, "none", None)
            assert not (tmp_path / OBSERVABILITY_FILE).exists()
            holder.offer(recs(3, 2))  # no Loki now: not taken
            await wait_until(lambda: not holder._retiring, limit_s=10)
            assert lines(loki) == ["line 0", "line 1", "line 2"]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"version": 2}',
                                  b'{"version": 1, "loki_url": "ftp://x"}',
                                  b'{"version": 1, "surprise": 1}'])
def test_a_corrupt_file_is_logged_and_ignored(tmp_path, caplog, body):
    (tmp_path / OBSERVABILITY_FILE).write_bytes(body)
    with caplog.at_level(logging.WARNING, logger="nodes.monitor.observability"):
        assert load_persisted(tmp_path) is None
        holder = ObservabilityHolder.from_storage(tmp_path, settings_url="http://loki:3100",
                                                  settings_tenant=None)
    assert [r.message.split()[0] for r in caplog.records] == ["monitor.observability.corrupt"] * 2
    assert (holder.value.loki_url, holder.origin) == ("http://loki:3100", "settings")


def test_no_file_and_no_settings_is_no_loki(tmp_path):
    holder = ObservabilityHolder.from_storage(tmp_path, settings_url=None, settings_tenant=None)
    assert holder.state().model_dump() == {
        "loki": False, "loki_url": None, "loki_tenant": None, "prometheus_url": None,
        "origin": "none", "persisted": False}


# -- the RPC side: in memory, autojump clock -----------------------------------------------


def _service(tmp_path) -> tuple[MonitorService, ObservabilityHolder]:
    # No storage: a file write runs in a thread, and the autojump clock would jump
    # past the test's deadline while it runs (persistence is tested above, in real time).
    holder = ObservabilityHolder()
    service = MonitorService(LogBuffer(), followers=[READER], observability=holder,
                             on_records=holder.offer)
    return service, holder


async def test_observability_set_is_for_followers_only(nursery, autojump_clock, tmp_path):
    service, holder = _service(tmp_path)
    await nursery.start(holder.run)
    async with connect(nursery, service, STRANGER) as stranger:
        with trio.fail_after(10):
            for method, params in [(OBSERVABILITY_SET, Observability(loki_url="http://l:3100")),
                                   (OBSERVABILITY_GET, ObservabilityQuery()),
                                   (OBSERVABILITY_CLEAR, ObservabilityClear())]:
                with pytest.raises(RpcError) as caught:
                    await stranger.call(method, params)
                assert caught.value.code == "FORBIDDEN"
    assert holder.state().loki is False


@pytest.mark.parametrize("field,value", [
    ("loki_url", "ftp://loki:3100"), ("loki_url", "http://"), ("loki_url", "http://l:3100?x=1"),
    ("loki_url", "http://l:99999"), ("loki_url", "http://l/" + "a" * 3000),
    ("prometheus_url", "javascript:alert(1)"), ("loki_tenant", "a\r\nX-Evil: 1"),
    ("loki_tenant", "t" * 151)])
async def test_bad_urls_and_tenants_are_refused_and_change_nothing(
        nursery, autojump_clock, tmp_path, field, value):
    service, holder = _service(tmp_path)
    await nursery.start(holder.run)
    async with connect(nursery, service, READER) as reader:
        with trio.fail_after(10):
            with pytest.raises(RpcError) as caught:
                await reader.call(OBSERVABILITY_SET, Observability.model_construct(
                    **{"loki_url": None, "loki_tenant": None, "prometheus_url": None,
                       field: value}))
            assert caught.value.code == "INVALID_PARAMS"
    assert holder.state().origin == "none"


async def test_a_follower_sets_and_reads_it_and_credentials_are_never_shown(
        nursery, autojump_clock, tmp_path):
    service, holder = _service(tmp_path)
    await nursery.start(holder.run)
    sent = Observability(loki_url="https://bob:s3cret@loki.example:3100/sub",
                         prometheus_url="http://prom:pw@prom.example:9090")
    async with connect(nursery, service, READER) as reader:
        with trio.fail_after(10):
            state = await reader.call(OBSERVABILITY_SET, sent)
            assert (state.loki, state.loki_url, state.prometheus_url, state.origin) == (
                True, "https://loki.example:3100/sub", "http://prom.example:9090", "app-node")
            assert await reader.call(OBSERVABILITY_GET, ObservabilityQuery()) == state
            status = await reader.call(STATUS, StatusRequest())
    assert "s3cret" not in json.dumps(status.model_dump()) and "pw@" not in str(status)
    assert status.details["loki"] is True
    assert status.details["loki_url"] == "https://loki.example:3100/sub"
    assert status.details["observability_from"] == "app-node"
    async with connect(nursery, service, READER) as reader:
        with trio.fail_after(10):
            cleared = await reader.call(OBSERVABILITY_CLEAR, ObservabilityClear())
            status = await reader.call(STATUS, StatusRequest())
    assert (cleared.loki, cleared.loki_url, cleared.prometheus_url, cleared.origin) == (
        False, None, None, "none")
    assert (status.details["loki"], status.details["observability_from"]) == (False, "none")


async def test_logs_query_answers_the_buffer_when_loki_cannot_be_reached(tmp_path):
    # Real time: the reader's connection is refused at once by a closed local port.
    holder = ObservabilityHolder(Observability(loki_url="http://127.0.0.1:9"),
                                 origin="settings")
    service = MonitorService(LogBuffer(), followers=[READER], observability=holder)
    service.buffer.append(recs(0, 3))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(holder.run)
            async with connect(nursery, service, READER) as reader:
                result = await reader.call(QUERY, Query(job_id="j-1"))
            nursery.cancel_scope.cancel()
    assert result.history.startswith("loki-error: Loki at http://127.0.0.1:9 unreachable")
    assert [r.text for r in decode_batch(result.records)] == ["line 0", "line 1", "line 2"]
