"""The worker's agent registry: who may report for which VMI, and silence (autojump clock)."""

from __future__ import annotations

import logging
import secrets
from contextlib import asynccontextmanager

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from contracts.agent_report import FAILED, HEARTBEAT, HELLO, READY, Heartbeat, Report
from nodes.k8s_worker.agents import AgentEventKind, AgentTable, BoundAgent, HelloDecision, decide
from p2p.rpc import RpcError
from tests.agents.helpers import agent_config, vmi_of

from .registry_client import AGENT, STRANGER, WORKER, client_as, hello_of, registry_and_events


async def test_hello_binds_the_callers_key_and_ready_and_heartbeats_follow(
        nursery, autojump_clock):
    config = agent_config(WORKER, heartbeat_interval_s=5)
    vmi = vmi_of(config)
    async with registry_and_events(nursery) as (registry, events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi)
        with trio.fail_after(5):
            result = await client.call(HELLO, hello_of(config))
            assert result.vmi == vmi.name
            event = await events.receive()
            assert (event.vmi_name, event.kind) == (vmi.name, AgentEventKind.HELLO)
            await client.call(READY, Report(message="serving"))
            event = await events.receive()
            assert (event.kind, event.message) == (AgentEventKind.READY, "serving")
        for _ in range(5):  # heartbeats in time: never silent
            await trio.sleep(4)
            await client.call(HEARTBEAT, Heartbeat())
        with pytest.raises(trio.WouldBlock):
            events.receive_nowait()
        state = registry.state(vmi.name)
        assert state.key == AGENT and state.ready and not state.silent


async def test_an_agent_is_silent_after_three_missed_heartbeats_and_back_when_it_reports(
        nursery, autojump_clock):
    config = agent_config(WORKER, heartbeat_interval_s=5)
    vmi = vmi_of(config)
    async with registry_and_events(nursery) as (registry, events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi)
        await client.call(HELLO, hello_of(config))
        await client.call(READY, Report())
        assert [(await events.receive()).kind for _ in range(2)] == [
            AgentEventKind.HELLO, AgentEventKind.READY]
        started = trio.current_time()
        with trio.fail_after(60):
            silent = await events.receive()
        assert silent.kind is AgentEventKind.SILENT and silent.vmi_name == vmi.name
        assert silent.at - started == pytest.approx(15, abs=0.01)  # 3 x 5 s
        assert registry.state(vmi.name).silent
        await trio.sleep(100)  # said once, not again
        with pytest.raises(trio.WouldBlock):
            events.receive_nowait()
        await client.call(HEARTBEAT, Heartbeat())
        back = await events.receive()
        assert back.kind is AgentEventKind.READY and not registry.state(vmi.name).silent


async def test_silent_after_s_overrides_the_heartbeat_multiple(nursery, autojump_clock):
    config = agent_config(WORKER, heartbeat_interval_s=5)
    async with registry_and_events(nursery, silent_after_s=2) as (registry, events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi_of(config))
        await client.call(HELLO, hello_of(config))
        assert (await events.receive()).kind is AgentEventKind.HELLO
        started = trio.current_time()
        assert (await events.receive()).kind is AgentEventKind.SILENT
        assert trio.current_time() - started == pytest.approx(2, abs=0.01)


@pytest.mark.parametrize(("change", "code"), [
    ({"token": "f" * 64}, "FORBIDDEN"),
    ({"replica": 7}, "UNKNOWN_REPLICA"),
    ({"node_rank": 1}, "UNKNOWN_REPLICA"),
    ({"job_id": "j-other"}, "UNKNOWN_REPLICA"),
    ({"generation": 0}, "STALE_GENERATION"),
])
async def test_a_hello_that_does_not_prove_the_vmi_is_refused_and_binds_nothing(
        change, code, nursery, autojump_clock):
    config = agent_config(WORKER, generation=2)
    async with registry_and_events(nursery) as (registry, events), \
            client_as(nursery, registry, STRANGER) as client:
        registry.expect(vmi_of(config))
        with pytest.raises(RpcError) as info:
            await client.call(HELLO, hello_of(config, **change))
        assert info.value.code == code
        assert registry.state(vmi_of(config).name).key is None
        with pytest.raises(RpcError) as info:  # and it cannot report either
            await client.call(READY, Report())
        assert info.value.code == "NOT_INTRODUCED"
        with pytest.raises(trio.WouldBlock):
            events.receive_nowait()


async def test_reports_from_another_key_than_the_bound_one_are_refused(nursery, autojump_clock):
    config = agent_config(WORKER)
    async with registry_and_events(nursery) as (registry, _events), \
            client_as(nursery, registry, AGENT) as agent, \
            client_as(nursery, registry, STRANGER) as stranger:
        registry.expect(vmi_of(config))
        await agent.call(HELLO, hello_of(config))
        for method, params in ((READY, Report()), (FAILED, Report()), (HEARTBEAT, Heartbeat())):
            with pytest.raises(RpcError) as info:
                await stranger.call(method, params)
            assert info.value.code == "NOT_INTRODUCED"
        assert registry.state(vmi_of(config).name).key == AGENT


async def test_a_failed_report_is_an_event_and_stops_the_silence_timer(nursery, autojump_clock):
    config = agent_config(WORKER, heartbeat_interval_s=1)
    async with registry_and_events(nursery) as (registry, events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi_of(config))
        await client.call(HELLO, hello_of(config))
        await client.call(FAILED, Report(message="model does not load"))
        kinds = [(await events.receive()) for _ in range(2)]
        assert kinds[1].kind is AgentEventKind.FAILED
        assert kinds[1].message == "model does not load"
        await trio.sleep(60)
        with pytest.raises(trio.WouldBlock):
            events.receive_nowait()


async def test_forgetting_a_vmi_unbinds_its_key_and_silences_nothing(nursery, autojump_clock):
    config = agent_config(WORKER, heartbeat_interval_s=1)
    async with registry_and_events(nursery) as (registry, events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi_of(config))
        await client.call(HELLO, hello_of(config))
        await events.receive()
        registry.forget(vmi_of(config).name)
        await trio.sleep(60)
        with pytest.raises(trio.WouldBlock):
            events.receive_nowait()
        with pytest.raises(RpcError) as info:
            await client.call(HEARTBEAT, Heartbeat())
        assert info.value.code == "NOT_INTRODUCED"


def test_expecting_again_keeps_the_binding_unless_the_generation_or_token_changed():
    table = AgentTable()
    config = agent_config(WORKER)
    vmi = vmi_of(config)
    table.expect(vmi)
    table.hello(AGENT, hello_of(config), now=1.0)
    table.expect(vmi)  # after a worker's adopt: same VMI
    assert table.state(vmi.name).key == AGENT
    restarted = config.model_copy(update={"generation": 1, "report_token": secrets.token_hex(32)})
    table.expect(vmi_of(restarted))
    assert table.state(vmi.name).key is None and table.state(vmi.name).generation == 1
    assert len(table) == 1
    with pytest.raises(Exception) as info:
        table.heartbeat(AGENT, now=2.0)
    assert info.value.code == "NOT_INTRODUCED"


def test_one_key_is_bound_to_one_vmi():
    table = AgentTable()
    first, second = agent_config(WORKER, replica=0), agent_config(WORKER, replica=1)
    table.expect(vmi_of(first))
    table.expect(vmi_of(second))
    table.hello(AGENT, hello_of(first), now=0.0)
    table.hello(AGENT, hello_of(second), now=0.0)
    assert table.state(vmi_of(first).name).key is None
    assert table.state(vmi_of(second).name).key == AGENT
    assert table.next_deadline() == pytest.approx(0.6)  # 3 x 0.2 s, the second only


# -- takeover ------------------------------------------------------------------

WINDOW = 15.0


@pytest.mark.parametrize(("key", "connected", "last_report", "now", "caller", "outcome"), [
    (None, False, None, 0.0, AGENT, HelloDecision.BIND),           # nobody bound
    (None, False, 99.0, 100.0, AGENT, HelloDecision.BIND),         # unbound after a restart
    (AGENT, True, 0.0, 1.0, AGENT, HelloDecision.RENEW),           # the agent reconnects
    (AGENT, False, 0.0, 100.0, AGENT, HelloDecision.RENEW),        # ... even long after
    (AGENT, True, 0.0, 1.0, STRANGER, HelloDecision.REFUSE),       # connected and fresh
    (AGENT, True, 0.0, 100.0, STRANGER, HelloDecision.REFUSE),     # connected, silent
    (AGENT, False, 90.0, 100.0, STRANGER, HelloDecision.REFUSE),   # gone a moment ago
    (AGENT, False, 85.0 + 1e-9, 100.0, STRANGER, HelloDecision.REFUSE),  # just within
    (AGENT, False, 85.0, 100.0, STRANGER, HelloDecision.REBIND),   # the window has passed
    (AGENT, False, None, 100.0, STRANGER, HelloDecision.REBIND),   # never reported
])
def test_decide_binds_renews_refuses_or_rebinds_by_the_bound_agents_life(
        key, connected, last_report, now, caller, outcome):
    assert decide(BoundAgent(key, connected, last_report, WINDOW), caller, now) is outcome


@asynccontextmanager
async def bound_and_another(nursery, connected: set[bytes]):
    """A VMI whose agent (``AGENT``) said hello, a client as ``STRANGER`` holding the
    same token, and the registry's view of connections (``connected``)."""
    config = agent_config(WORKER, heartbeat_interval_s=5)
    async with registry_and_events(nursery) as (registry, events), \
            client_as(nursery, registry, AGENT) as bound, \
            client_as(nursery, registry, STRANGER) as other:
        registry.connected = connected.__contains__
        registry.expect(vmi_of(config))
        await bound.call(HELLO, hello_of(config))
        yield config, registry, events, bound, other


async def test_a_stolen_token_does_not_take_a_live_vmi_over(nursery, autojump_clock, caplog):
    """Regression: a second key with the VMI's (stolen) token is refused
    while the bound agent lives; the victim keeps its binding and its reports count,
    the worker logs a warning naming the VMI and both keys."""
    async with bound_and_another(nursery, {AGENT}) as (config, registry, events, victim,
                                                       thief):
        vmi = vmi_of(config)
        await victim.call(READY, Report(message="serving"))
        caplog.set_level(logging.WARNING, logger="nodes.k8s_worker.agents")
        for wait in (0, 30):  # fresh, then silent but still connected
            await trio.sleep(wait)
            with pytest.raises(RpcError) as info:
                await thief.call(HELLO, hello_of(config))
            assert info.value.code == "ALREADY_BOUND"
            assert registry.state(vmi.name).key == AGENT
        (line, *_) = [r.getMessage() for r in caplog.records if "takeover_refused" in r.message]
        assert vmi.name in line and AGENT.hex() in line and STRANGER.hex() in line
        assert config.report_token not in caplog.text
        with pytest.raises(RpcError) as info:
            await thief.call(READY, Report())
        assert info.value.code == "NOT_INTRODUCED"
        await victim.call(HEARTBEAT, Heartbeat())  # the victim's binding is intact
        await victim.call(READY, Report(message="still mine"))
        kinds = []
        while True:
            try:
                kinds.append(events.receive_nowait().kind)
            except trio.WouldBlock:
                break
        assert kinds.count(AgentEventKind.HELLO) == 1  # the thief's hello made none


async def test_once_the_bound_agent_is_gone_a_new_key_rebinds_and_it_is_logged(
        nursery, autojump_clock, caplog):
    """An agent whose storage was lost comes back with a new key: it binds once the old
    one is neither connected nor heard from within the window."""
    connected = {AGENT}
    async with bound_and_another(nursery, connected) as (config, registry, _events, old, new):
        vmi = vmi_of(config)
        connected.clear()  # its connection broke
        with pytest.raises(RpcError) as info:  # but it reported a moment ago
            await new.call(HELLO, hello_of(config))
        assert info.value.code == "ALREADY_BOUND"
        await trio.sleep(3 * 5 + 1)  # silent past the window (3 heartbeats)
        caplog.set_level(logging.WARNING, logger="nodes.k8s_worker.agents")
        result = await new.call(HELLO, hello_of(config))
        assert result.vmi == vmi.name and registry.state(vmi.name).key == STRANGER
        (line,) = [r.getMessage() for r in caplog.records if "agent.rebound" in r.message]
        assert vmi.name in line and AGENT.hex() in line and STRANGER.hex() in line
        with pytest.raises(RpcError) as info:  # the old key is unbound
            await old.call(HEARTBEAT, Heartbeat())
        assert info.value.code == "NOT_INTRODUCED"


def test_a_refused_takeover_leaves_the_callers_other_binding_alone():
    """The thief's key, bound to a VMI of its own, stays bound there when its hello for
    another (live) VMI is refused: a refusal changes nothing."""
    table = AgentTable()
    mine, theirs = agent_config(WORKER, replica=0), agent_config(WORKER, replica=1)
    table.expect(vmi_of(mine))
    table.expect(vmi_of(theirs))
    table.hello(STRANGER, hello_of(mine), now=0.0)
    table.hello(AGENT, hello_of(theirs), now=0.0)
    with pytest.raises(Exception) as info:
        table.hello(STRANGER, hello_of(theirs), now=0.1)
    assert info.value.code == "ALREADY_BOUND"
    assert table.state(vmi_of(mine).name).key == STRANGER
    assert table.state(vmi_of(theirs).name).key == AGENT


@given(bound=st.sampled_from([None, AGENT, STRANGER]), caller=st.sampled_from([AGENT, STRANGER]),
       connected=st.booleans(), last_report=st.none() | st.floats(0, 1_000),
       now=st.floats(0, 2_000), window=st.floats(0.1, 100))
def test_decide_never_hands_a_live_vmi_to_another_key_nor_refuses_its_own(
        bound, caller, connected, last_report, now, window):
    state = BoundAgent(bound, connected, last_report, window)
    outcome = decide(state, caller, now)
    if bound is None:
        assert outcome is HelloDecision.BIND
    elif bound == caller:
        assert outcome is HelloDecision.RENEW
    else:
        alive = connected or (last_report is not None and now - last_report < window)
        assert outcome is (HelloDecision.REFUSE if alive else HelloDecision.REBIND)
