"""A stopped or slow wrk-monitor does not slow proxy-inference under load.

The proxy runs with its real ``telemetry`` settings (``nodes/kit/telemetry.py``: a
``ShipperHandler`` on the root logger, a ``LogShipper`` pushing to the monitor), a small
``max_records``, and two replicas of which one refuses every request: each request that
meets the refusing one first is tried again on the other and logs ``proxy.retry`` on the
request path, so the load makes log records (a successful request logs none). Then,
with the monitor (a) a key nobody serves, at an address where nothing listens, or (b) a
monitor service whose ``logs.push`` does not answer until the test lets it:

- every request succeeds;
- the shipper's queue never holds more than ``max_records`` and ``dropped`` counts
  what it let go (on the proxy's metrics endpoint too);
- the request path never awaits the shipper: all the requests are answered while no
  push was ever acknowledged (a), or while the first push is still held (b). Nothing
  is timed.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import httpx
import pytest
import trio

from contracts.monitor import PushBatch, PushResult
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from p2p.keys import KeyPair
from p2p.metrics import ProcessMetrics
from p2p.rpc import CallContext
from p2p.swarm import Swarm, SwarmConfig
from runtime.log_shipper import LogShipper, ShipperHandler
from tests.nodes.proxy_inference.harness import CHAT, ProxyWorld, proxy_world, two_agents
from tests.p2p.helpers import wait_until
from tests.ports import free_port

pytestmark = pytest.mark.slow

#: The shipper's bound: far below what the load logs, so that it drops.
MAX_RECORDS = 8
#: Requests, and how many are in flight at once. About half meet the refusing replica
#: first: ~45 retry lines, five times the bound (240 requests and a bound of 20 proved
#: nothing more, at 2.5 times the CPU).
REQUESTS = 96
CONCURRENCY = 24


class HeldMonitor(MonitorService):
    """wrk-monitor's service whose ``logs.push`` waits for :attr:`gate` before it
    accepts a batch (a monitor too slow to answer, as long as the test wants)."""

    def __init__(self) -> None:
        super().__init__(LogBuffer(), allow_any_pusher=True)
        self.gate = trio.Event()
        #: Pushes that reached the service, and those it answered.
        self.started = 0
        self.answered = 0

    async def _push(self, params: PushBatch, ctx: CallContext) -> PushResult:
        self.started += 1
        await self.gate.wait()
        result = await super()._push(params, ctx)
        self.answered += 1
        return result


def the_shipper() -> LogShipper:
    """The shipper the proxy's telemetry attached to the root logger (one in this test)."""
    shippers = [h.shipper for h in logging.getLogger().handlers if isinstance(h, ShipperHandler)]
    assert len(shippers) == 1, shippers
    return shippers[0]


@asynccontextmanager
async def loaded_proxy(tmp_path, caplog, monitor: bytes, address: tuple[str, int]):
    """The proxy (telemetry to ``monitor`` at ``address``), a key, a refusing and an
    answering replica; yields (world, secret, shipper, metrics)."""
    caplog.set_level(logging.INFO)  # the daemon kit's default level: records are made
    caplog.set_level(logging.WARNING, logger="httpx")  # the test's client: not the proxy's
    async with proxy_world(tmp_path) as world:
        _, secret = await world.add_key()
        metrics = ProcessMetrics()
        await world.start_proxy(
            metrics=metrics,
            replica_backoff_s=0.001,
            replica_backoff_max_s=0.001,
            telemetry={
                "monitor": monitor.hex(),
                "monitor_addresses": [f"{address[0]}:{address[1]}"],
                "max_records": MAX_RECORDS,
            },
        )
        await world.wait_replicated()
        await two_agents(world, modes=("unavailable", "ok"))
        yield world, secret, the_shipper(), metrics


async def load(world: ProxyWorld, secret: str, shipper: LogShipper) -> tuple[list[int], int]:
    """``REQUESTS`` chats, ``CONCURRENCY`` at a time; returns their statuses and the most
    records the shipper held at any point (sampled after every answer)."""
    statuses: list[int] = []
    most = 0
    todo = iter(range(REQUESTS))
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(
        base_url=world.proxy.url,
        timeout=30,
        limits=limits,
        headers={"Authorization": f"Bearer {secret}"},
    ) as http:

        async def worker() -> None:
            nonlocal most
            for _ in todo:
                response = await http.post("/chat/completions", json=CHAT)
                statuses.append(response.status_code)
                most = max(most, shipper.pending)

        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
    return statuses, most


def sample(metrics: ProcessMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"{name} not on the proxy's endpoint"
    return value


async def test_a_monitor_nobody_serves_does_not_slow_the_proxy(tmp_path, caplog):
    nobody = KeyPair.generate().public_key
    with trio.fail_after(120):
        async with loaded_proxy(tmp_path, caplog, nobody, ("127.0.0.1", free_port())) as (
            world,
            secret,
            shipper,
            metrics,
        ):
            statuses, most = await load(world, secret, shipper)
            assert statuses == [200] * REQUESTS
            retries = sample(metrics, "proxy_upstream_retries_total", model="chat")
            assert retries > MAX_RECORDS  # the load logged more than the queue holds
            assert most <= MAX_RECORDS and shipper.pending <= MAX_RECORDS
            # Never connected, nothing taken: each retry's line is queued or dropped.
            assert shipper.dropped >= retries - MAX_RECORDS
            assert shipper.sent == 0 and not shipper.connected
            assert sample(metrics, "telemetry_records_dropped_total") == shipper.dropped
            assert sample(metrics, "telemetry_connected") == 0


async def test_a_monitor_that_holds_its_pushes_does_not_slow_the_proxy(tmp_path, caplog):
    held = HeldMonitor()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            monitor = Swarm(
                KeyPair.generate(), config=SwarmConfig(host="127.0.0.1"), services=[held]
            )
            address = await nursery.start(monitor.run)
            async with loaded_proxy(tmp_path, caplog, monitor.keypair.public_key, address) as (
                world,
                secret,
                shipper,
                metrics,
            ):
                # The proxy's start-up lines went out in the first push, which is held.
                await wait_until(lambda: held.started >= 1, limit_s=30)
                statuses, most = await load(world, secret, shipper)
                # Every request answered while that push was still unanswered.
                assert held.answered == 0 and shipper.sent == 0
                assert statuses == [200] * REQUESTS
                retries = sample(metrics, "proxy_upstream_retries_total", model="chat")
                assert retries > MAX_RECORDS
                assert most <= MAX_RECORDS and shipper.pending <= MAX_RECORDS
                # Each retry's line is queued, dropped, or in a push (each takes at most
                # the queue's bound; a push timed out is taken again on a new channel).
                assert shipper.dropped >= retries - MAX_RECORDS * (1 + held.started)
                assert sample(metrics, "telemetry_records_dropped_total") == shipper.dropped
                # Let the monitor answer: what was kept arrives and the queue drains.
                held.gate.set()
                await wait_until(lambda: shipper.sent >= 1 and shipper.pending == 0, limit_s=30)
                arrived = [r for _, r in held.buffer.records()]
                # (more only if a held push timed out and its batch was sent again)
                assert len(arrived) >= shipper.sent
                assert {r.service for r in arrived} == {"proxy-inference"}
            nursery.cancel_scope.cancel()
