"""A worker's agent service on a real 127.0.0.1 swarm, agent configs for it,
``cosmicac agent run`` as a process, and a collector of the log records it ships."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from contracts.agent_config import AgentConfig
from contracts.model import JobType
from contracts.monitor import LogRecord
from nodes.k8s_worker.agents import AgentEvent, AgentRegistry
from nodes.k8s_worker.backend import VmiSpec, disk_name, vmi_name
from p2p.keys import KeyPair
from p2p.swarm import Swarm, SwarmConfig
from tests.cli.helpers import COSMICAC


def agent_config(worker: bytes, *, address: tuple[str, int] | None = None, storage: str = "",
                 job_id: str = "j-abc123", replica: int = 0, generation: int = 0,
                 node_rank: int = 0, node_count: int = 1, token: str | None = None,
                 heartbeat_interval_s: float = 0.2) -> AgentConfig:
    """A config for one agent of a GPU Container Job, reporting to ``worker``."""
    return AgentConfig(
        job_id=job_id, replica=replica, generation=generation, node_rank=node_rank,
        node_count=node_count, job_type=JobType.CONTAINER, gpus=1, worker=worker.hex(),
        worker_addresses=(f"{address[0]}:{address[1]}",) if address else (),
        report_token=token or secrets.token_hex(32), heartbeat_interval_s=heartbeat_interval_s,
        storage=storage or "/nonexistent", log_level="debug")


def vmi_of(config: AgentConfig, node: str = "local-node-1") -> VmiSpec:
    return VmiSpec(name=vmi_name(config.job_id, config.replica, config.node_rank),
                   disk=disk_name(config.job_id, config.replica, config.node_rank),
                   node=node, gpus=config.gpus, node_rank=config.node_rank, agent=config)


@dataclass
class Worker:
    keypair: KeyPair
    swarm: Swarm
    registry: AgentRegistry
    events: trio.MemoryReceiveChannel[AgentEvent]
    address: tuple[str, int]

    async def next_event(self, timeout_s: float = 15.0) -> AgentEvent:
        with trio.fail_after(timeout_s):
            return await self.events.receive()


@asynccontextmanager
async def running_worker(nursery: trio.Nursery, *, port: int = 0, keypair: KeyPair | None = None,
                         silent_after_s: float | None = None, on_logs=None, **swarm_config):
    """The worker's side: a swarm on 127.0.0.1 serving an :class:`AgentRegistry`
    (``swarm_config``: more of its SwarmConfig, its relays say)."""
    keypair = keypair or KeyPair.generate()
    send, receive = trio.open_memory_channel[AgentEvent](64)
    registry = AgentRegistry(send, silent_after_s=silent_after_s, on_logs=on_logs)
    swarm = Swarm(keypair, config=SwarmConfig(host="127.0.0.1", port=port, **swarm_config),
                  services=[registry.service])
    async with trio.open_nursery() as inner:
        address = await inner.start(swarm.run)
        await inner.start(registry.run)
        try:
            yield Worker(keypair, swarm, registry, receive, address)
        finally:
            inner.cancel_scope.cancel()


async def start_agent(config_file, log_path):
    """``cosmicac agent run``, its output (JSON log lines, errors) in ``log_path``."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return await trio.lowlevel.open_process(
            [*COSMICAC, "agent", "run", "--config", str(config_file)],
            stdout=log_fd, stderr=subprocess.STDOUT)
    finally:
        os.close(log_fd)


async def stop(proc, timeout_s: float = 10.0) -> int:
    """TERM ``proc`` (unless it has exited) and return its exit code."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    with trio.fail_after(timeout_s):
        return await proc.wait()


class Collected:
    """The worker's ``on_logs``: what its own shipper would be offered."""

    def __init__(self) -> None:
        self.records: list[LogRecord] = []

    def __call__(self, records) -> None:
        self.records.extend(records)

    def texts(self) -> list[str]:
        return [r.text for r in self.records]
