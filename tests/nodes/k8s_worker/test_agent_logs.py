"""``agent.logs`` on the worker: only an introduced agent may send, every record is
re-stamped with its own replica, a bad batch is a typed error (never a crash),
and telemetry off means accepted and discarded (autojump clock, in-memory muxes)."""

from __future__ import annotations

import json

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.agent_config import AgentConfig
from contracts.agent_report import HELLO, LOGS, ReportCode
from contracts.model import JobSpec, JobType, NodeShare, ReplicaPlacement, Runtime
from contracts.monitor import (
    APPLICATION,
    MAX_BATCH_BYTES,
    SYSTEM,
    LogRecord,
    PushBatch,
    encode_batch,
    make_record,
)
from nodes.k8s_worker.agents import AgentRefused, AgentTable
from nodes.k8s_worker.backend import replica_unit
from p2p.rpc import RpcError
from tests.agents.helpers import agent_config, vmi_of
from tests.examples import examples

from .registry_client import (
    AGENT,
    STRANGER,
    WORKER,
    Collected,
    client_as,
    hello_of,
    registry_and_events,
)


def forged(n: int = 3) -> list[LogRecord]:
    """Records that claim another job, replica and service than the sender's."""
    return [make_record(f"line {i}", service="wrk-ork", job_id="j-victim", replica=9,
                        source=APPLICATION if i % 2 else SYSTEM, level=10 * (i + 1),
                        time_ns=1_000 + i) for i in range(n)]


def batch(records) -> PushBatch:
    return PushBatch(records=encode_batch(records))


async def test_an_introduced_agents_records_are_restamped_with_its_own_replica(
        nursery, autojump_clock):
    config = agent_config(WORKER, job_id="j-mine", replica=3)
    collected = Collected()
    async with registry_and_events(nursery, on_logs=collected) as (registry, _events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi_of(config))
        await client.call(HELLO, hello_of(config))
        with trio.fail_after(5):
            result = await client.call(LOGS, batch(forged()))
        assert result.accepted == 3
        assert collected.records == [
            LogRecord(1_000, "j-mine", 3, SYSTEM, 10, "agent-instance", "line 0"),
            LogRecord(1_001, "j-mine", 3, APPLICATION, 20, "agent-instance", "line 1"),
            LogRecord(1_002, "j-mine", 3, SYSTEM, 30, "agent-instance", "line 2")]
        assert registry.log_records == 3
        assert (await client.call(LOGS, batch([]))).accepted == 0
        assert len(collected.batches) == 1  # an empty batch is not handed on


def test_an_inference_agents_records_are_agent_inference():
    config = agent_config(WORKER).model_copy(update={
        "job_type": JobType.INFERENCE, "runtime": Runtime.VLLM, "model": "m"})
    table = AgentTable()
    table.expect(vmi_of(config))
    table.hello(AGENT, hello_of(config), now=0.0)
    [record] = table.logs(AGENT, encode_batch(forged(1)))
    assert (record.job_id, record.replica, record.service) == (config.job_id, 0,
                                                               "agent-inference")


@pytest.mark.parametrize("data", [
    b"",
    b"\xc1",  # never used in msgpack
    msgpack.packb({"records": []}),
    msgpack.packb([[1, 2, 3]]),
    msgpack.packb([[1, None, None, "Kernel", 20, "x", "y"]]),  # no such source
    msgpack.packb([[-1, None, None, "System", 20, "x", "y"]]),
    msgpack.packb([[1, None, None, "System", 20, "x", "y" * 20_000]]),  # not cut
    msgpack.packb([[1, None, None, "System", 20, "x", "y"]]) + b"\x00",  # trailing bytes
    b"\xdd\xff\xff\xff\xff",  # an array header claiming 4 G records
])
async def test_a_bad_batch_is_refused_whole_and_the_agent_may_go_on(data, nursery,
                                                                    autojump_clock):
    config = agent_config(WORKER)
    collected = Collected()
    async with registry_and_events(nursery, on_logs=collected) as (registry, _events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi_of(config))
        await client.call(HELLO, hello_of(config))
        with pytest.raises(RpcError) as info, trio.fail_after(5):
            await client.call(LOGS, PushBatch(records=data))
        assert info.value.code == ReportCode.BAD_BATCH
        assert collected.records == [] and registry.bad_log_batches == 1
        assert (await client.call(LOGS, batch(forged(2)))).accepted == 2
        assert len(collected.records) == 2


async def test_an_oversized_batch_is_refused_by_the_params_check(nursery, autojump_clock):
    config = agent_config(WORKER)
    async with registry_and_events(nursery, on_logs=Collected()) as (registry, _events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi_of(config))
        await client.call(HELLO, hello_of(config))
        with pytest.raises(RpcError) as info, trio.fail_after(5):
            await client.call(LOGS, PushBatch.model_construct(
                records=b"\x90" * (MAX_BATCH_BYTES + 1)))
        assert info.value.code == "INVALID_PARAMS"
        assert registry.bad_log_batches == 0  # refused before the handler


async def test_a_caller_without_hello_or_without_a_key_cannot_send_logs(nursery,
                                                                        autojump_clock):
    config = agent_config(WORKER)
    collected = Collected()
    async with registry_and_events(nursery, on_logs=collected) as (registry, _events), \
            client_as(nursery, registry, AGENT) as agent, \
            client_as(nursery, registry, STRANGER) as stranger, \
            client_as(nursery, registry, None) as anonymous:
        registry.expect(vmi_of(config))
        with pytest.raises(RpcError) as info:  # not introduced yet
            await agent.call(LOGS, batch(forged()))
        assert info.value.code == ReportCode.NOT_INTRODUCED
        await agent.call(HELLO, hello_of(config))
        for client, code in ((stranger, ReportCode.NOT_INTRODUCED),
                             (anonymous, ReportCode.FORBIDDEN)):
            with pytest.raises(RpcError) as info:
                await client.call(LOGS, batch(forged()))
            assert info.value.code == code
        # Forgetting the VMI (deleted) unbinds the key: its logs are refused too.
        registry.forget(vmi_of(config).name)
        with pytest.raises(RpcError) as info:
            await agent.call(LOGS, batch(forged()))
        assert info.value.code == ReportCode.NOT_INTRODUCED
        assert collected.records == [] and registry.log_records == 0


async def test_with_telemetry_off_batches_are_answered_and_discarded(nursery, autojump_clock):
    config = agent_config(WORKER)
    async with registry_and_events(nursery) as (registry, _events), \
            client_as(nursery, registry, AGENT) as client:
        registry.expect(vmi_of(config))
        await client.call(HELLO, hello_of(config))
        assert (await client.call(LOGS, batch(forged(5)))).accepted == 5
        assert registry.log_records == 5


def test_logs_do_not_keep_a_silent_agent_alive():
    config = agent_config(WORKER, heartbeat_interval_s=1)
    table = AgentTable()
    table.expect(vmi_of(config))
    table.hello(AGENT, hello_of(config), now=0.0)
    assert table.next_deadline() == pytest.approx(3.0)
    table.logs(AGENT, encode_batch(forged()))
    assert table.next_deadline() == pytest.approx(3.0)
    [silent] = table.expire(now=3.0)
    table.logs(AGENT, encode_batch(forged()))  # still taken from the bound key
    assert table.state(silent.vmi_name).silent


@st.composite
def hostile_batches(draw) -> bytes:
    """Arbitrary bytes, or msgpack of arrays of arbitrary (often nearly right) records."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=512))
    scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**63,
                                                              max_value=2**64 - 1),
                       st.floats(allow_nan=True), st.text(max_size=80), st.binary(max_size=20),
                       st.sampled_from(["System", "Application", "system"]))
    record = st.one_of(
        st.lists(scalar, max_size=9),
        st.tuples(st.integers(-5, 2**63), st.one_of(st.none(), st.text(max_size=70)),
                  st.one_of(st.none(), st.integers(-2, 70_000)),
                  st.sampled_from(["System", "Application", "Other"]), st.integers(-1, 101),
                  st.text(max_size=70), st.text(max_size=100)))
    payload = draw(st.one_of(st.lists(record, max_size=6), scalar,
                             st.dictionaries(st.text(max_size=5), scalar, max_size=3)))
    data = msgpack.packb(payload, use_bin_type=True)
    return data + draw(st.binary(max_size=4))


_TABLE = AgentTable()
_CONFIG = agent_config(WORKER, job_id="j-fuzz", replica=7)
_TABLE.expect(vmi_of(_CONFIG))
_TABLE.hello(AGENT, hello_of(_CONFIG), now=0.0)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_batches())
def test_any_bytes_give_restamped_records_or_bad_batch_never_another_error(data: bytes):
    try:
        records = _TABLE.logs(AGENT, data)
    except AgentRefused as exc:
        assert exc.code is ReportCode.BAD_BATCH
        return
    for record in records:
        assert (record.job_id, record.replica, record.service) == ("j-fuzz", 7,
                                                                   "agent-instance")
        assert record.source in (SYSTEM, APPLICATION) and 0 <= record.level <= 100
    assert encode_batch(records)  # what the worker's shipper will send encodes


@pytest.mark.parametrize("telemetry", [False, True])
def test_the_worker_renders_telemetry_into_every_agents_config(telemetry):
    spec = JobSpec(name="llama", team="t1", type="inference", image="docker://r/i:1", gpus=16,
                   runtime="vllm", model="meta-llama/Llama-3.1-70B")
    placement = ReplicaPlacement(rack="ab" * 32, shares=(NodeShare(node="n1", gpus=8),
                                                        NodeShare(node="n2", gpus=8)))
    unit = replica_unit("j-1", 0, spec, placement, telemetry=telemetry,
                        agent={"worker": WORKER.hex(), "report_token": "ef" * 32})
    assert [vmi.agent.telemetry for vmi in unit.vmis] == [telemetry, telemetry]
    rendered = json.loads(unit.vmis[0].agent.to_json())
    # Off is left out, so an agent image older than the field still reads its config.
    assert rendered.get("telemetry") is (True if telemetry else None)
    assert AgentConfig.model_validate(rendered).telemetry is telemetry
