"""agent-inference: the model server of a Managed Inference Job's replica, served to the proxies.

An :class:`InferenceWorkload` is what :class:`agents._agent.Agent` runs for an
inference job. From the agent's config it builds the runtime adapter's plan
(``runtimes/``), supervises it (``_supervisor.py``) and serves
``cosmicac-inference/1`` (``_service.py``) on the agent's swarm. While the
model server is healthy the replica is announced on the job's DHT topic
(:func:`contracts.inference.job_topic`) and the worker is told ready; when it
is not, the announcement is withdrawn and the worker told unready, so the
proxy stops choosing it and the job shows Degraded. A server that keeps
crashing ends the workload: the agent reports the replica failed.

Only the head of a multi-node replica (node rank 0) runs the HTTP server and
is announced; the other ranks run their Ray worker and report ready while it
lives.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, Sequence

import trio

from contracts.agent_config import AgentConfig
from contracts.inference import job_topic
from p2p.host import Service
from p2p.swarm import Swarm

from ._forward import ModelClient
from ._service import InferenceService, ServedModel
from ._supervisor import ModelSupervisor, SupervisorPolicy
from .runtimes import Launch, RuntimePlan, adapter_for

__all__ = ["InferenceWorkload", "free_port"]

log = logging.getLogger("cosmicac.agent.inference")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the model server binds it next)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class InferenceWorkload:
    """The model server of one VMI of an inference replica, and its service.

    Args:
        config: the agent's config (``job_type`` inference, ``runtime``, ``model``).
        port: the model server's port on loopback; None: a free one.
        policy: the supervisor's timing.
        env: the environment of the model server's processes (default: ours).
        extra_args: operator flags for the model server's command line.

    Raises:
        AdapterError: the runtime cannot run this replica (raised by :meth:`run`,
            so the agent reports it to the worker rather than dying unseen).
    """

    def __init__(self, config: AgentConfig, *, port: int | None = None,
                 policy: SupervisorPolicy | None = None, env: Mapping[str, str] | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        if config.runtime is None or config.model is None:
            raise ValueError("an inference agent's config needs a runtime and a model")
        self.config = config
        self.port = port or free_port()
        self.policy = policy
        self.env = env
        self.extra_args = tuple(extra_args)
        self.served_name = config.served_name or config.model
        self.topic = job_topic(config.job_id)
        self.client = ModelClient("127.0.0.1", self.port)
        self.healthy = False
        self.announced = False
        self.supervisor: ModelSupervisor | None = None
        proxies = frozenset(bytes.fromhex(key) for key in config.authorized_keys)
        peers = frozenset([bytes.fromhex(config.worker),
                           *(bytes.fromhex(key) for key in config.relays)])
        self.service = InferenceService(
            ServedModel(job_id=config.job_id, replica=config.replica,
                        served_name=self.served_name, model=config.model,
                        runtime=config.runtime.value),
            self.client, healthy=lambda: self.healthy, proxies=proxies.__contains__,
            peers=peers.__contains__)

    @property
    def services(self) -> Sequence[Service]:
        return [self.service]

    def plan(self) -> RuntimePlan:
        """The adapter's plan for this VMI (AdapterError names a bad field)."""
        c = self.config
        assert c.runtime is not None and c.model is not None
        launch = Launch(model=c.model, served_name=self.served_name, port=self.port,
                        gpus=c.gpus,
                        node_rank=c.node_rank, node_count=c.node_count,
                        head_address=c.head_address,
                        node_address=c.head_address if c.node_rank == 0 else None,
                        extra_args=self.extra_args)
        return adapter_for(c.runtime).plan(launch)

    def metrics(self) -> dict[str, float]:
        """This workload's figures for the agent's heartbeat (reads of counters
        the supervisor and the service keep; nothing is measured here)."""
        service = self.service
        values = {"model_server_up": float(self.healthy),
                  "inference_calls_total": float(service.requests),
                  "inference_calls_in_flight": float(service.in_flight)}
        supervisor = self.supervisor
        if supervisor is not None:
            values["model_server_restarts_total"] = float(max(0, supervisor.starts - 1))
            values["model_server_consecutive_failures"] = float(supervisor.probe_failures)
            values["model_server_consecutive_crashes"] = float(supervisor.crashes)
            if supervisor.last_probe_ms is not None:
                values["model_server_health_check_ms"] = supervisor.last_probe_ms
        return values

    async def run(self, status, swarm: Swarm) -> None:
        """Supervise the model server until cancelled (see the module doc).

        Raises:
            AdapterError: the replica's runtime, model or layout cannot run.
            ModelServerFailed: the server crashed too often.
        """
        plan = self.plan()
        changes_send, changes = trio.open_memory_channel[tuple[bool, str]](64)

        def on_health(healthy: bool, why: str) -> None:
            self.healthy = healthy
            try:
                changes_send.send_nowait((healthy, why))
            except trio.WouldBlock:  # only the latest matters; the loop rereads self.healthy
                pass

        self.supervisor = ModelSupervisor(plan, on_health=on_health, job_id=self.config.job_id,
                                          policy=self.policy, env=self.env)
        log.info("inference.starting job=%s replica=%d runtime=%s model=%s served_name=%s "
                 "port=%d", self.config.job_id, self.config.replica, plan.runtime,
                 self.config.model, self.served_name, self.port)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow, changes, status, swarm, plan.listens)
                await self.supervisor.run()
        finally:
            self.healthy = False
            with trio.CancelScope(shield=True):
                await self.client.aclose()

    async def _follow(self, changes: trio.MemoryReceiveChannel[tuple[bool, str]], status,
                      swarm: Swarm, announce: bool) -> None:
        async for healthy, why in changes:
            if healthy != self.healthy:
                continue  # a later change is queued behind this one
            if healthy:
                status.ready(f"model server healthy ({self.served_name})")
                if announce and not self.announced:
                    swarm.join(self.topic, server=True, client=False)
                    self.announced = True
                    log.info("inference.announced job=%s topic=%s", self.config.job_id,
                             self.topic.hex()[:16])
            else:
                status.unready(f"model server unhealthy: {why}")
                if self.announced:
                    self.announced = False
                    await swarm.leave(self.topic)
                    log.info("inference.withdrawn job=%s", self.config.job_id)
