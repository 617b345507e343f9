"""cosmicac-monitor/1 for the tests: the callers' keys, records, a service and a
client of it over an in-memory mux; a figure read from a /metrics page."""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager

from prometheus_client.parser import text_string_to_metric_families

from contracts.monitor import PROTOCOL, make_record
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from p2p.rpc import RpcClient, RpcConfig, serve_rpc
from tests.p2p.mux_pairs import running_mux_pair

DAEMON = b"\x01" * 32
READER = b"\x03" * 32
STRANGER = b"\x02" * 32


def recs(start: int, n: int, *, job: str = "j-1", source: str = "System"):
    return [make_record(f"line {i}", service="wrk-ork", job_id=job, source=source,
                        time_ns=i) for i in range(start, start + n)]


@asynccontextmanager
async def connect(nursery, service: MonitorService, key: bytes | None,
                  config: RpcConfig | None = None):
    async with running_mux_pair(nursery) as (left, right):
        listener = right.listen(PROTOCOL)
        client_channel = await left.open_channel(PROTOCOL)
        server_channel = await listener.accept()
        await nursery.start(functools.partial(serve_rpc, server_channel, service.router,
                                              remote_public_key=key))
        client = RpcClient(client_channel, config=config)
        await nursery.start(client.run)
        try:
            yield client
        finally:
            await client.aclose()


def make_service(**kw) -> MonitorService:
    return MonitorService(LogBuffer(**kw), pushers=[DAEMON], followers=[READER])


def metric(text: str, name: str) -> float:
    """The value of the sample ``name`` on a /metrics page."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")
