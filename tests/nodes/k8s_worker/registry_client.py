"""The worker's agent registry for the tests: keys, a hello for a config, a running
registry with its events, a client calling it as a given key, and a log sink."""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager

import trio

from contracts.agent_report import Hello
from contracts.monitor import LogRecord
from nodes.k8s_worker.agents import AgentRegistry
from p2p.rpc import RpcClient, serve_rpc
from tests.p2p.mux_pairs import running_mux_pair

WORKER = b"\x01" * 32
AGENT = b"\x02" * 32
STRANGER = b"\x03" * 32


def hello_of(config, **changes) -> Hello:
    fields = dict(job_id=config.job_id, replica=config.replica, generation=config.generation,
                  node_rank=config.node_rank, token=config.report_token)
    return Hello(**(fields | changes))


@asynccontextmanager
async def registry_and_events(nursery, **kwargs):
    send, receive = trio.open_memory_channel(16)
    registry = AgentRegistry(send, **kwargs)
    await nursery.start(registry.run)
    yield registry, receive


@asynccontextmanager
async def client_as(nursery, registry: AgentRegistry, key: bytes):
    """An RPC client whose calls reach the registry as from ``key`` (Noise-proven there)."""
    async with running_mux_pair(nursery) as (left, right):
        listener = right.listen(registry.service.protocol)
        channel = await left.open_channel(registry.service.protocol)
        server_channel = await listener.accept()
        await nursery.start(functools.partial(serve_rpc, server_channel,
                                              registry.service.router, remote_public_key=key))
        client = RpcClient(channel)
        await nursery.start(client.run)
        yield client
        await client.aclose()


class Collected:
    """An ``on_logs`` that keeps what it is given (the worker's shipper's offer_many)."""

    def __init__(self) -> None:
        self.batches: list[list[LogRecord]] = []

    def __call__(self, records) -> None:
        self.batches.append(list(records))

    @property
    def records(self) -> list[LogRecord]:
        return [r for batch in self.batches for r in batch]
