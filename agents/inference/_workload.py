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

Addresses of a multi-node replica: the config's ``head_address`` is a name
(on KubeVirt ``<vmi>.<service>.<ns>.svc.<domain>``, which the cluster DNS
answers with the head's pod address), good for the other ranks to dial Ray's
head. It is no good as Ray's ``--node-ip-address``, which Ray takes as this
node's IP and advertises to the others: so every rank gives Ray its own IPv4
on the overlay interface (:func:`interface_ipv4`) when the config names one,
the head included (its plan then runs Ray's head and ``vllm serve`` on that
address). See :meth:`InferenceWorkload.plan`.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import trio

from contracts.agent_config import AgentConfig
from contracts.inference import job_topic
from contracts.runtime_settings import HUB_TOKEN_KEY
from p2p.host import Service
from p2p.swarm import Swarm

from ._forward import ModelClient
from ._launcher import StepLauncher
from ._service import InferenceService, ServedModel
from ._supervisor import ModelSupervisor, SupervisorPolicy
from .runtimes import InvalidLaunch, Launch, RuntimePlan, adapter_for

__all__ = ["InferenceWorkload", "free_port", "interface_ipv4"]

log = logging.getLogger("cosmicac.agent.inference")

#: ``SIOCGIFADDR`` (linux/sockios.h): an interface's IPv4 address.
_SIOCGIFADDR = 0x8915


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the model server binds it next)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def interface_ipv4(interface: str) -> str | None:
    """The IPv4 address of network interface ``interface``, or None (no such
    interface, or no IPv4 address on it yet). Linux only; a local ioctl, no traffic."""
    request = struct.pack("256s", interface.encode()[:15])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
    except OSError:
        return None
    return str(ipaddress.IPv4Address(answer[20:24]))  # ifr_addr's sin_addr


def read_hub_token(path: str) -> str:
    """The model hub token in file ``path`` (the mounted Secret's ``token`` key).

    Raises:
        InvalidLaunch: missing, unreadable, empty or not one line of text.
    """
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise InvalidLaunch("hub_token_file", f"cannot read the model hub token at {path}: "
                            f"{why} (is the model master's hub_token_secret there, with the "
                            f"key '{HUB_TOKEN_KEY}'?)") from None
    if not token or any(ch in token for ch in "\r\n\x00"):
        raise InvalidLaunch("hub_token_file", f"the model hub token at {path} is empty or "
                            "not a single line")
    return token


class InferenceWorkload:
    """The model server of one VMI of an inference replica, and its service.

    Args:
        config: the agent's config (``job_type`` inference, ``runtime``, ``model``).
        port: the model server's port on loopback; None: a free one.
        policy: the supervisor's timing.
        env: the environment of the model server's processes (default: ours).
        extra_args: operator flags for the model server's command line.
        interface_address: this VMI's IPv4 on a named interface, or None
            (default: :func:`interface_ipv4`); tests pass their own.
        launcher: the zygote forked before trio started that forks our own model
            server pre-imported (``_launcher.py``); None: it is spawned.

    Raises:
        AdapterError: the runtime cannot run this replica (raised by :meth:`run`,
            so the agent reports it to the worker rather than dying unseen).
    """

    def __init__(self, config: AgentConfig, *, port: int | None = None,
                 policy: SupervisorPolicy | None = None, env: Mapping[str, str] | None = None,
                 extra_args: Sequence[str] = (),
                 interface_address: Callable[[str], str | None] = interface_ipv4,
                 launcher: StepLauncher | None = None) -> None:
        if config.runtime is None or config.model is None:
            raise ValueError("an inference agent's config needs a runtime and a model")
        self.config = config
        self.port = port or free_port()
        self.policy = policy
        self.env = env
        self.extra_args = tuple(extra_args)
        self.interface_address = interface_address
        self.launcher = launcher
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

    def node_address(self) -> str | None:
        """This VMI's address for Ray (``--node-ip-address``, ``VLLM_HOST_IP``).

        Its IPv4 on the overlay interface, when the config names one and it
        has an address: Ray wants an IP there, one the other nodes reach and
        that is unique in the replica. The pod network is neither under
        KubeVirt's masquerade binding (every guest is 10.0.2.2 behind its pod's
        NAT), and a DNS name is not an IP. None otherwise: Ray picks.
        """
        if self.config.node_count < 2 or self.config.overlay_interface is None:
            return None
        return self.interface_address(self.config.overlay_interface)

    def plan(self) -> RuntimePlan:
        """The adapter's plan for this VMI (AdapterError names a bad field).

        A rank > 0 dials the head by the config's ``head_address`` (a name is
        fine there: ``ray start --address`` and our wait resolve it) and gives
        Ray its own overlay address. The head itself is told its own overlay
        address as ``head_address``: the adapter runs ``ray start --head
        --node-ip-address HEAD`` and points ``vllm serve`` at ``HEAD:port``,
        all on this VMI, so the head needs no DNS, and Ray advertises an IP
        the other ranks reach over the overlay rather than the name (which
        the cluster DNS answers with the pod network's address). Without an
        overlay address (no interface configured, as on the local and qemu
        backends, or none yet) the head keeps the config's ``head_address``,
        as before.
        """
        c = self.config
        assert c.runtime is not None and c.model is not None
        node_address = self.node_address()
        head_address = c.head_address
        if c.node_rank == 0 and node_address is not None:
            head_address = node_address
        launch = Launch(model=c.model, served_name=self.served_name, port=self.port,
                        gpus=c.gpus,
                        node_rank=c.node_rank, node_count=c.node_count,
                        head_address=head_address,
                        node_address=head_address if c.node_rank == 0 else node_address,
                        overlay_interface=c.overlay_interface, ib_hca=c.ib_hca,
                        extra_args=(*c.runtime_args, *self.extra_args),
                        env=self.runtime_env())
        return adapter_for(c.runtime).plan(launch)

    def runtime_env(self) -> dict[str, str]:
        """The model server's environment from the config: the model cache as
        ``HF_HOME``, the hub token as ``HF_TOKEN``, then the master's and job's
        variables (which may set either: an operator's choice wins).

        Raises:
            InvalidLaunch: the hub token file is configured but cannot be read.
        """
        c = self.config
        env: dict[str, str] = {}
        if c.model_cache_dir:
            env["HF_HOME"] = c.model_cache_dir
        if c.hub_token_file:
            env["HF_TOKEN"] = read_hub_token(c.hub_token_file)
        env.update(c.runtime_env)
        return env

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
                                          policy=self.policy, env=self.env,
                                          launcher=self.launcher)
        log.info("inference.starting job=%s replica=%d runtime=%s model=%s served_name=%s "
                 "port=%d", self.config.job_id, self.config.replica, plan.runtime,
                 self.config.model, self.served_name, self.port)
        try:
            async with trio.open_nursery() as nursery:
                if self.launcher is not None:
                    await nursery.start(self.launcher.run)
                nursery.start_soon(self._follow, changes, status, swarm, plan.listens)
                await self.supervisor.run()  # raises; the launcher's zygote goes with it
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
