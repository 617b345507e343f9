"""agent-inference end to end on real sockets: a real model server subprocess
(the ``local`` runtime, ``demo`` model) under the supervisor, the agent's
reports to a real worker registry, the DHT announcement on the job's topic,
and the proxy's side of ``cosmicac-inference/1``."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from contextlib import asynccontextmanager

import pytest
import trio

from agents._agent import Agent, ReportPolicy
from agents.inference import InferenceWorkload, SupervisorPolicy
from contracts.agent_config import AgentConfig
from contracts.inference import (
    AGENT_STATUS,
    INFER,
    PROTOCOL,
    UPLOAD,
    Empty,
    InferRequest,
    UploadChunk,
    job_topic,
)
from contracts.model import JobType, Runtime
from nodes.k8s_worker.agents import AgentEventKind
from p2p.keys import KeyPair
from p2p.rpc import RpcClient, RpcError

from ...p2p.helpers import wait_until
from ...p2p.swarm.helpers import swarm_net
from ..helpers import agent_config, running_worker, vmi_of

PROXY = KeyPair.from_seed(bytes(range(7, 39)))
FAST = SupervisorPolicy(probe_interval_s=0.2, startup_probe_interval_s=0.05,
                        probe_timeout_s=2.0, unhealthy_after=2, restart_unhealthy_s=5.0,
                        backoff_min_s=0.1, backoff_max_s=0.5, max_crashes=3,
                        stable_after_s=60.0)


def inference_config(worker: bytes, address, bootstrap, *, model: str = "demo",
                     served_name: str = "chat-demo") -> AgentConfig:
    base = agent_config(worker, address=address)
    return base.model_copy(update={
        "job_type": JobType.INFERENCE, "runtime": Runtime.LOCAL, "model": model,
        "served_name": served_name, "authorized_keys": (PROXY.hex,),
        "bootstrap": tuple(f"{h}:{p}" for h, p in bootstrap)})


@asynccontextmanager
async def inference_agent(*, model: str = "demo", policy: SupervisorPolicy = FAST):
    async with (swarm_net(dht_nodes=3) as net, trio.open_nursery() as nursery,
                running_worker(nursery) as worker):
        config = inference_config(worker.keypair.public_key, worker.address, net.bootstrap,
                                  model=model)
        worker.registry.expect(vmi_of(config))
        workload = InferenceWorkload(config, policy=policy)
        agent = Agent(config, KeyPair.generate(), bootstrap=net.bootstrap,
                      worker_addresses=[worker.address], workload=workload,
                      policy=ReportPolicy(backoff_min_s=0.05, backoff_max_s=0.2))
        nursery.start_soon(agent.run)
        try:
            yield net, worker, agent, workload
        finally:
            nursery.cancel_scope.cancel()


async def next_kind(worker, kind: AgentEventKind, timeout_s: float = 60.0):
    with trio.fail_after(timeout_s):
        while True:
            event = await worker.next_event(timeout_s)
            if event.kind == kind:
                return event


@asynccontextmanager
async def proxy_client(net, agent: Agent, keypair: KeyPair = PROXY):
    swarm = await net.start(keypair)
    connection = await swarm.connect(agent.keypair.public_key,
                                     addresses=[agent.swarm_address])
    async with rpc_client(connection) as client:
        yield client


@asynccontextmanager
async def rpc_client(connection):
    """The proxy's RPC client of ``cosmicac-inference/1`` over ``connection``."""
    channel = await connection.open_channel(PROTOCOL)
    client = RpcClient(channel, name="proxy")
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        yield client
        nursery.cancel_scope.cancel()


async def collect(client: RpcClient, request: InferRequest):
    frames = []
    async with client.stream(INFER, request) as items:
        async for frame in items:
            frames.append(frame)
    return frames


def chat(stream: bool = False, **extra) -> bytes:
    return json.dumps({"model": "chat-demo", "max_tokens": 8, "stream": stream,
                       "messages": [{"role": "user", "content": "hello there"}],
                       **extra}).encode()


async def test_a_healthy_model_server_serves_only_the_proxy_and_comes_back_when_killed():
    """One agent (its model server costs a start) for what a healthy replica does: it
    is ready and announced, a proxy finds it on the job's DHT topic and, over that
    connection, gets whole and streamed answers, the server's own errors, and the
    answer to a large body sent in uploads first; a key that is not a configured proxy
    is refused at the handshake. Then its model server is killed: the replica is
    withdrawn (unhealthy, unannounced), the server restarted, and served again."""
    async with inference_agent() as (net, worker, agent, workload):
        await next_kind(worker, AgentEventKind.READY)
        assert workload.announced
        # The proxy's way to it: the job's DHT topic, then calls over that connection.
        proxy = await net.start(PROXY)
        proxy.join(job_topic(agent.config.job_id), server=False, client=True)
        await wait_until(lambda: agent.keypair.public_key in proxy.connections, limit_s=30)
        connection = proxy.connections[agent.keypair.public_key]
        assert job_topic(agent.config.job_id) in connection.topics
        async with rpc_client(connection) as client:
            status = await client.call(AGENT_STATUS, Empty())
            assert (status.served_name, status.healthy, status.runtime) == (
                "chat-demo", True, "local")

            frames = await collect(client, InferRequest(path="/v1/chat/completions",
                                                        body=chat()))
            assert len(frames) == 1 and frames[0].status == 200 and frames[0].done
            answer = json.loads(frames[0].data)
            assert frames[0].usage.prompt_tokens == answer["usage"]["prompt_tokens"] > 0
            assert frames[0].usage.completion_tokens == answer["usage"]["completion_tokens"]

            # Streamed without include_usage: the agent asked for usage (the
            # proxy bills by it) but keeps the usage chunk from the client.
            frames = await collect(client, InferRequest(path="/v1/chat/completions",
                                                        body=chat(stream=True)))
            data = b"".join(frame.data for frame in frames)
            assert frames[0].status == 200 and frames[0].content_type.startswith(
                "text/event-stream")
            assert data.endswith(b"data: [DONE]\n\n") and b'"usage"' not in data
            assert frames[-1].done and frames[-1].usage.completion_tokens > 0

            frames = await collect(client, InferRequest(
                path="/v1/chat/completions",
                body=chat(stream=True, stream_options={"include_usage": True})))
            data = b"".join(frame.data for frame in frames)
            assert b'"usage"' in data and frames[-1].usage.total_tokens > 0

            # A model server's own 400 passes through, with nothing billed.
            frames = await collect(client, InferRequest(path="/v1/chat/completions",
                                                        body=b"{not json"))
            assert frames[0].status == 400 and frames[0].usage.total_tokens == 0

            # A large body arrives in uploads first, then the request names it.
            filler = "x" * (300 << 10)
            body = chat(user=filler)
            half = len(body) // 2
            for offset, piece in ((0, body[:half]), (half, body[half:])):
                result = await client.call(UPLOAD, UploadChunk(
                    upload_id="u1", offset=offset, total=len(body), data=piece))
            assert result.received == len(body)
            frames = await collect(client, InferRequest(path="/v1/chat/completions",
                                                        upload_id="u1"))
            assert frames[0].status == 200
            with pytest.raises(RpcError) as caught:  # used up
                await collect(client, InferRequest(path="/v1/chat/completions",
                                                   upload_id="u1"))
            assert caught.value.code == "BAD_REQUEST"

            # Only the configured proxies may call: another key is refused at the
            # handshake's firewall.
            stranger = await net.start(KeyPair.generate())
            with pytest.raises(Exception):  # noqa: B017 - refused at the handshake's firewall
                with trio.fail_after(10):
                    refused = await stranger.connect(agent.keypair.public_key,
                                                     addresses=[agent.swarm_address])
                    channel = await refused.open_channel(PROTOCOL)
                    refused_client = RpcClient(channel)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(refused_client.run)
                        await refused_client.call(AGENT_STATUS, Empty())

            # A killed model server: withdrawn, restarted, served again.
            pid = workload.supervisor.pids["local"]
            os.kill(pid, signal.SIGKILL)
            unready = await next_kind(worker, AgentEventKind.HELLO)
            assert "unhealthy" in unready.message
            assert not workload.announced
            await next_kind(worker, AgentEventKind.READY)
            assert workload.announced and workload.supervisor.pids["local"] != pid
            # The proxy's connection and client, still open, are served again.
            frames = await collect(client, InferRequest(path="/v1/completions",
                                                        body=b'{"model":"chat-demo",'
                                                             b'"prompt":"hi","max_tokens":2}'))
            assert frames[0].status == 200


async def test_a_model_server_that_keeps_crashing_fails_the_replica_with_its_reason():
    # Two crashes are enough to show a restart and the limit (each costs a model
    # server's start, ~0.3 s of CPU).
    policy = dataclasses.replace(FAST, max_crashes=2)
    async with inference_agent(model="no-such-model", policy=policy) as (_net, worker, _a, _w):
        failed = await next_kind(worker, AgentEventKind.FAILED)
        assert "failed 2 times" in failed.message
        assert "no-such-model" in failed.message  # the server's last words say why
