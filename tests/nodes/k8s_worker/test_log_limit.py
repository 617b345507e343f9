"""Each agent's log budget at the worker (``log_limit.py``): the token bucket never
grants more than ``burst + rate * elapsed`` and refills; over ``agent.logs`` a
chatty agent is cut (the first records of a batch kept, the call still answered)
while a quiet agent's records and the worker's own System records all pass; the
drops are counted per job on ``/metrics`` and said in one warning a minute per
agent (autojump clock, in-memory muxes)."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from contracts.agent_report import HELLO, LOGS
from contracts.monitor import APPLICATION, SYSTEM, LogRecord, PushBatch, encode_batch, make_record
from nodes.k8s_worker.log_limit import (
    DEFAULT_LOG_BURST,
    DEFAULT_LOG_RATE_PER_S,
    LogLimit,
    LogLimiter,
    TokenBucket,
)
from nodes.k8s_worker.metrics import worker_snapshot
from nodes.k8s_worker.settings import AgentsSettings
from nodes.kit.metrics import snapshot_registry
from runtime.log_shipper import LogShipper, ShipperHandler
from tests.agents.helpers import agent_config, vmi_of

from .registry_client import (
    AGENT,
    STRANGER,
    WORKER,
    Collected,
    client_as,
    hello_of,
    registry_and_events,
)

CHATTY, QUIET = AGENT, STRANGER  # two introduced agents, one VMI each

# -- the bucket ----------------------------------------------------------------------------

steps = st.lists(st.tuples(st.floats(min_value=0, max_value=10, allow_nan=False),
                           st.integers(min_value=0, max_value=5_000)), max_size=60)


@given(rate=st.floats(min_value=0.01, max_value=10_000), burst=st.integers(1, 5_000),
       start=st.floats(min_value=-1e6, max_value=1e6), steps=steps)
def test_a_bucket_never_grants_more_than_burst_plus_rate_times_elapsed(rate, burst, start,
                                                                        steps):
    bucket = TokenBucket(rate, burst, start)
    now, granted = start, 0
    for dt, n in steps:
        now += dt
        got = bucket.take(n, now)
        assert 0 <= got <= n
        granted += got
        # Up to float rounding of the refills (an integer count cannot hide in it).
        assert granted <= burst + rate * (now - start) + 1e-6


@given(rate=st.floats(min_value=0.5, max_value=10_000), burst=st.integers(1, 5_000),
       wait=st.floats(min_value=0, max_value=100))
def test_a_drained_bucket_refills_at_rate_up_to_burst(rate, burst, wait):
    bucket = TokenBucket(rate, burst, 0.0)
    assert bucket.take(burst + 10, 0.0) == burst  # full at first
    assert bucket.take(1, 0.0) == 0
    got = bucket.take(10**9, wait)
    assert abs(got - min(burst, rate * wait)) <= 1
    assert bucket.take(1, wait) == 0  # what was there is taken: less than one left


def test_time_going_backwards_refills_nothing_and_bad_limits_are_refused():
    bucket = TokenBucket(10, 5, 100.0)
    assert bucket.take(5, 100.0) == 5
    assert bucket.take(5, 50.0) == 0  # earlier: nothing refilled, never negative
    assert bucket.take(5, 100.5) == 5  # 0.5 s after the latest time seen
    for rate, burst in ((0, 5), (-1, 5), (math.inf, 5), (math.nan, 5), (10, 0)):
        with pytest.raises(ValueError):
            TokenBucket(rate, burst, 0.0)


# -- the limiter ---------------------------------------------------------------------------

def test_the_limiter_warns_once_per_interval_with_what_was_dropped_since():
    limiter = LogLimiter(LogLimit(rate=10, burst=100, warn_interval_s=60))
    first = limiter.admit("vmi-a", "j-a", 150, now=0.0)
    assert (first.kept, first.dropped) == (100, 50)
    assert first.warning.startswith("50 log records dropped over the worker's limit of "
                                    "10/s (burst 100); of each batch over budget the first "
                                    "records were kept, the newest dropped")
    for t in range(1, 60):  # 10 more a second are taken, the rest dropped, no new line
        admission = limiter.admit("vmi-a", "j-a", 30, now=float(t))
        assert (admission.kept, admission.dropped, admission.warning) == (10, 20, None)
    again = limiter.admit("vmi-a", "j-a", 30, now=60.0)
    assert again.warning.startswith("1200 log records dropped over the worker's limit of "
                                    "10/s (burst 100) in the last 60 s;")
    assert limiter.dropped_by_job == {"j-a": 50 + 1200} and limiter.dropped == 1250
    assert limiter.admit("vmi-b", "j-b", 100, now=60.0).dropped == 0  # its own bucket


def test_a_forgotten_agents_bucket_goes_and_the_tables_are_bounded():
    limiter = LogLimiter(LogLimit(rate=1, burst=1), max_agents=3, max_jobs=2)
    limiter.admit("v1", "j1", 5, now=0.0)
    assert limiter.admit("v1", "j1", 1, now=0.0).kept == 0
    limiter.forget("v1")
    limiter.forget("v1")  # unknown: no-op
    assert len(limiter) == 0
    assert limiter.admit("v1", "j1", 1, now=0.0).kept == 1  # a new VMI, a new bucket
    for name in ("v2", "v3", "v4", "v5"):
        limiter.admit(name, "j" + name[1], 2, now=0.0)
    assert len(limiter) == 3  # the least recently used went
    # Jobs: the oldest counts go first, never the one just counted.
    assert limiter.dropped_by_job == {"j4": 1, "j5": 1}
    assert limiter.dropped == 4 + 1 + 4 * 1


@given(st.lists(st.tuples(st.sampled_from(["admit", "forget"]), st.integers(0, 20),
                          st.integers(0, 9)), max_size=200))
def test_the_limiters_tables_never_outgrow_their_bounds(calls):
    limiter = LogLimiter(LogLimit(rate=1, burst=2), max_agents=5, max_jobs=4)
    now = 0.0
    for op, vmi, job in calls:
        now += 0.1
        if op == "admit":
            limiter.admit(f"v{vmi}", f"j{job}", 3, now)
        else:
            limiter.forget(f"v{vmi}")
        assert len(limiter) <= 5 and len(limiter.dropped_by_job) <= 4
        assert sum(limiter._live_jobs.values()) == len(limiter)


def test_the_settings_defaults_and_bounds():
    agents = AgentsSettings()
    assert (agents.log_rate_per_s, agents.log_burst) == (200.0, 1_000)
    assert agents.log_limit() == LogLimit(rate=DEFAULT_LOG_RATE_PER_S, burst=DEFAULT_LOG_BURST)
    assert AgentsSettings(log_rate_per_s=5, log_burst=7).log_limit() == LogLimit(5, 7)
    for bad in ({"log_rate_per_s": 0}, {"log_burst": 0}):
        with pytest.raises(ValueError):
            AgentsSettings(**bad)


# -- over the protocol ---------------------------------------------------------------------

def records(prefix: str, n: int) -> list[LogRecord]:
    return [make_record(f"{prefix} {i}", service="x", source=APPLICATION, time_ns=1_000 + i)
            for i in range(n)]


def batch(items) -> PushBatch:
    return PushBatch(records=encode_batch(items))


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "nodes.k8s_worker.agents" and r.getMessage().startswith("agent logs cut")]


async def test_a_chatty_agent_is_cut_while_a_quiet_agents_records_all_pass(
        nursery, autojump_clock, caplog):
    caplog.set_level(logging.INFO)
    chatty, quiet = (agent_config(WORKER, job_id="j-chatty", replica=1),
                     agent_config(WORKER, job_id="j-quiet", replica=0))
    collected = Collected()
    limit = LogLimit(rate=200, burst=1_000)
    async with registry_and_events(nursery, on_logs=collected, log_limit=limit) as (
            registry, _events), \
            client_as(nursery, registry, CHATTY) as loud, \
            client_as(nursery, registry, QUIET) as calm:
        for config in (chatty, quiet):
            registry.expect(vmi_of(config))
        await loud.call(HELLO, hello_of(chatty))
        await calm.call(HELLO, hello_of(quiet))
        sent_quiet = 0
        accepted = []
        with trio.fail_after(30):
            for second in range(3):  # 5,000 lines a second against 200/s
                for i in range(5):
                    result = await loud.call(LOGS, batch(records(f"s{second} b{i}", 1_000)))
                    accepted.append(result.accepted)
                await calm.call(LOGS, batch(records(f"quiet {second}", 10)))
                sent_quiet += 10
                await trio.sleep(1)
        # The first burst is taken whole, then about 200 a second: not refused, answered.
        assert accepted[:5] == [1_000, 0, 0, 0, 0]
        assert 199 <= accepted[5] <= 201 and accepted[6:10] == [0] * 4
        kept = [r for r in collected.records if r.job_id == "j-chatty"]
        assert len(kept) == sum(accepted)
        # Of a cut batch, its first records are kept.
        assert [r.text for r in kept[1_000:1_010]] == [f"s1 b0 {i}" for i in range(10)]
        assert {(r.replica, r.service) for r in kept} == {(1, "agent-instance")}
        quiet_texts = [r.text for r in collected.records if r.job_id == "j-quiet"]
        assert len(quiet_texts) == sent_quiet == 30
        assert registry.log_records == sum(accepted) + 30
        dropped = 15_000 - sum(accepted)
        assert registry.limited_log_records == {"j-chatty": dropped}
        # One warning line for the agent in these 3 s (at its first cut batch), not
        # one per cut batch.
        [warning] = warnings_of(caplog)
        assert warning.startswith(f"agent logs cut on {vmi_of(chatty).name}: 1000 log records "
                                  "dropped over the worker's limit of 200/s (burst 1000)")
        assert warning.endswith("| system job=j-chatty replica=1")
        line = next(r for r in caplog.records if r.getMessage() == warning)
        assert (line.levelno, line.job_id, line.replica) == (logging.WARNING, "j-chatty", 1)
        # A minute later, the next cut says what was dropped since.
        await trio.sleep(60)
        for i in range(2):
            await loud.call(LOGS, batch(records(f"late {i}", 1_000)))
        assert len(warnings_of(caplog)) == 2 and "in the last 6" in warnings_of(caplog)[1]
        # The VMI forgotten: its bucket goes with it.
        registry.forget(vmi_of(chatty).name)
        assert len(registry.table.log_limiter) == 1


async def test_a_new_hello_from_the_same_vmi_gets_no_fresh_burst(nursery, autojump_clock):
    config = agent_config(WORKER)
    async with registry_and_events(nursery, log_limit=LogLimit(rate=1, burst=100)) as (
            registry, _events), \
            client_as(nursery, registry, AGENT) as first, \
            client_as(nursery, registry, STRANGER) as second:
        registry.expect(vmi_of(config))
        await first.call(HELLO, hello_of(config))
        assert (await first.call(LOGS, batch(records("a", 150)))).accepted == 100
        await trio.sleep(0.7)  # the first one is gone (silent past 3 x 0.2 s)...
        await second.call(HELLO, hello_of(config))  # ...and came back with a new key
        assert (await second.call(LOGS, batch(records("b", 150)))).accepted == 0


async def test_the_workers_own_records_are_never_limited_nor_pushed_out(nursery,
                                                                        autojump_clock):
    """The worker's shipper holds 3,000 records; a chatty agent sends 20,000 between
    the worker's own step lines. Limited, the worker's lines all stay queued;
    unlimited (the gap this closes), the flood pushes them out."""
    config = agent_config(WORKER, job_id="j-chatty")
    step_log = logging.getLogger("nodes.k8s_worker.worker")
    outcomes = {}
    for limit in (LogLimit(rate=200, burst=1_000), None):
        shipper = LogShipper(max_records=3_000)
        handler = ShipperHandler(shipper, service="wrk-server-k8s-nvidia")
        root = logging.getLogger()
        level = root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            async with registry_and_events(nursery, on_logs=shipper.offer_many,
                                           log_limit=limit) as (registry, _events), \
                    client_as(nursery, registry, AGENT) as client:
                registry.expect(vmi_of(config))
                await client.call(HELLO, hello_of(config))
                for i in range(20):
                    step_log.info("step %d | system job=j-1 replica=0", i,
                                  extra={"job_id": "j-1", "replica": 0})
                    await client.call(LOGS, batch(records(f"flood {i}", 1_000)))
                    await trio.sleep(0.5)
        finally:
            root.removeHandler(handler)
            root.setLevel(level)
        queued = shipper._take() + [r for _ in range(10) for r in shipper._take()]
        own = [r for r in queued if r.service == "wrk-server-k8s-nvidia"]
        outcomes[limit is not None] = (shipper.dropped, own)
    dropped, own = outcomes[True]
    assert dropped == 0
    steps_kept = [r.text for r in own if r.job_id == "j-1"]
    assert steps_kept == [f"step {i} | system job=j-1 replica=0" for i in range(20)]
    assert all(r.source == SYSTEM for r in own)
    # The warning is itself one of the worker's own records, filed under the agent's job.
    assert any(r.job_id == "j-chatty" and r.text.startswith("agent logs cut") for r in own)
    dropped, own = outcomes[False]
    assert dropped > 0 and len([r for r in own if r.job_id == "j-1"]) < 20


async def test_the_dropped_records_are_a_counter_by_job_on_the_workers_metrics(
        nursery, autojump_clock):
    config = agent_config(WORKER, job_id="j-chatty")
    async with registry_and_events(nursery, log_limit=LogLimit(rate=10, burst=100)) as (
            registry, _events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi_of(config))
        await client.call(HELLO, hello_of(config))
        await client.call(LOGS, batch(records("x", 250)))
        worker = SimpleNamespace(statistics=lambda: {}, bad_operations=0, backend=None)
        queue = SimpleNamespace(statistics=lambda: SimpleNamespace(pending=0, acked=0,
                                                                   connected=True))
        snapshot = worker_snapshot(worker, queue, registry)
        text = generate_latest(snapshot_registry(lambda: snapshot)).decode()
    assert 'worker_agent_log_records_limited_total{job="j-chatty"} 150.0' in text
    assert "worker_agent_log_records_total 100.0" in text
