"""What a runtime adapter is given (:class:`Launch`) and what it answers (:class:`RuntimePlan`).

An adapter is pure: it never starts a process, opens a socket or reads the
environment. It turns a :class:`Launch` (this VMI's part of one replica) into
an ordered tuple of :class:`Step` s and a description of how to tell the model
server is healthy. The supervisor (``agents/inference/_supervisor.py``) owns
every process and every clock; it follows the plan like this:

1. Start the steps in order. A ``RUN_TO_EXIT`` step must exit 0 within its
   ``timeout_s`` before the next step starts (kill it and fail the plan
   otherwise). A ``KEEP_RUNNING`` step is started and left running; the next
   step starts at once.
2. If the plan ``listens``: poll ``GET base_url + health_path`` until it
   answers 200, for at most ``startup_timeout_s`` from the start of the
   server step; then send the ``deep_check`` (when there is one) and accept
   the server when :meth:`DeepCheck.passed` says so. Afterwards poll both as
   the supervisor likes.
   If the plan does not listen (a multi-node vLLM rank > 0, which only runs a
   Ray worker): the member is healthy exactly while every ``KEEP_RUNNING``
   step is alive.
3. Any ``KEEP_RUNNING`` step that exits means the whole plan failed: the
   steps depend on each other (vLLM dies with its Ray head), so stop the rest
   and restart from step 1, never one step alone.
4. Stop in reverse order (the server before the Ray head), SIGTERM first,
   SIGKILL after the step's ``stop_timeout_s``.

Each step's ``env`` holds additions only; the supervisor lays them over its
own environment.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from contracts.model import Runtime
from contracts.runtime_settings import managed_flag_problem

from ._errors import GpuLayoutError, InvalidLaunch, ManagedFlagError, TopologyError

__all__ = [
    "DEFAULT_RAY_PORT",
    "DeepCheck",
    "Launch",
    "Lifetime",
    "RuntimeAdapter",
    "RuntimePlan",
    "Step",
    "StepRole",
    "gpus_per_node",
]

#: Ray's own default GCS port (``ray start --head`` without ``--port``).
DEFAULT_RAY_PORT = 6379
#: How long rank 0 waits for every node to join Ray, and a rank > 0 for the
#: head's port to open. VMIs of one replica boot within minutes of each other;
#: ten minutes covers a slow disk import on one node without hiding a node
#: that will never come.
DEFAULT_NODE_WAIT_S = 600.0
#: SIGTERM to SIGKILL. vLLM drains and frees GPU memory on SIGTERM; 30 s is
#: Kubernetes' default terminationGracePeriodSeconds.
DEFAULT_STOP_TIMEOUT_S = 30.0


def _frozen_env(env: Mapping[str, str], owner: str) -> Mapping[str, str]:
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise InvalidLaunch(owner, f"bad environment variable name {key!r}")
        if not isinstance(value, str) or "\x00" in value:
            raise InvalidLaunch(owner, f"environment variable {key} must be a string")
    return MappingProxyType(dict(env))


@dataclass(frozen=True, slots=True)
class Launch:
    """This VMI's share of one replica: everything an adapter needs, nothing of AgentConfig.

    Validated when built (:class:`InvalidLaunch` / :class:`TopologyError`
    naming the field); what only one runtime refuses is checked by its adapter.
    """

    #: The model to load: a Hugging Face id or a path inside the VMI
    #: (``meta-llama/Llama-3.1-70B-Instruct``, ``nvidia/parakeet-tdt-0.6b-v2``, ``demo``).
    model: str
    #: The name clients put in ``model``; the server answers to it alone.
    served_name: str
    #: The model server's HTTP port. Never 0: the agent must know where to look.
    port: int
    #: GPUs this VMI holds (vLLM's tensor-parallel size on this node).
    gpus: int
    #: Where the server listens. 127.0.0.1 by default: the agent is the only
    #: client, and the proxy reaches the agent over the swarm, not this socket.
    host: str = "127.0.0.1"
    #: This VMI's place in a multi-node replica; 0 is the head (the one that serves HTTP).
    node_rank: int = 0
    #: VMIs in the replica (vLLM's pipeline-parallel size).
    node_count: int = 1
    #: The rank-0 VMI's address on the overlay network; required when node_count > 1.
    head_address: str | None = None
    #: This VMI's own overlay address (Ray's ``--node-ip-address``, ``VLLM_HOST_IP``).
    #: Rank 0's is ``head_address``; on other ranks, None lets Ray pick an
    #: interface, which may not be the overlay's.
    node_address: str | None = None
    #: The Ray head's GCS port on the overlay.
    ray_port: int = DEFAULT_RAY_PORT
    #: The interpreter that runs our own Python entry points (the agent's).
    python: str = field(default_factory=lambda: sys.executable)
    #: Operator-given flags appended to the model server's command line.
    extra_args: tuple[str, ...] = ()
    #: Operator-given environment, laid over the adapter's own additions.
    env: Mapping[str, str] = field(default_factory=dict)
    #: The overlay network interface inside the VMI (``NCCL_SOCKET_IFNAME``,
    #: ``GLOO_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME``); None: let NCCL choose.
    overlay_interface: str | None = None
    #: InfiniBand HCAs for NCCL (``NCCL_IB_HCA``, e.g. ``mlx5``); None: NCCL's default.
    ib_hca: str | None = None
    #: Overrides the runtime's default bound on model loading, in seconds.
    startup_timeout_s: float | None = None
    #: Bound on waiting for the other nodes of a multi-node replica, in seconds.
    node_wait_timeout_s: float = DEFAULT_NODE_WAIT_S

    def __post_init__(self) -> None:
        if not self.model.strip():
            raise InvalidLaunch("model", "must not be empty")
        if not self.served_name.strip():
            raise InvalidLaunch("served_name", "must not be empty")
        for name in ("port", "ray_port"):
            value = getattr(self, name)
            if not 1 <= value <= 65535:
                raise InvalidLaunch(name, f"must be a TCP port (1-65535), not {value}")
        if self.gpus < 0:
            raise GpuLayoutError("gpus", f"must be 0 or more, not {self.gpus}")
        if self.node_count < 1:
            raise TopologyError("node_count", f"must be 1 or more, not {self.node_count}")
        if not 0 <= self.node_rank < self.node_count:
            raise TopologyError(
                "node_rank", f"must be in 0..{self.node_count - 1}, not {self.node_rank}"
            )
        if self.startup_timeout_s is not None and self.startup_timeout_s <= 0:
            raise InvalidLaunch("startup_timeout_s", "must be positive")
        if self.node_wait_timeout_s <= 0:
            raise InvalidLaunch("node_wait_timeout_s", "must be positive")
        if isinstance(self.extra_args, str) or not all(
            isinstance(arg, str) for arg in self.extra_args
        ):
            raise InvalidLaunch("extra_args", "must be a sequence of strings")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        object.__setattr__(self, "env", _frozen_env(self.env, "env"))

    @property
    def multi_node(self) -> bool:
        return self.node_count > 1

    @property
    def ray_address(self) -> str:
        """``HEAD:RAY_PORT`` (IPv6 bracketed); only meaningful for a multi-node replica."""
        head = self.head_address or ""
        return f"[{head}]:{self.ray_port}" if ":" in head else f"{head}:{self.ray_port}"

    @property
    def local_url(self) -> str:
        """Where the agent reaches the server: a wildcard host means loopback."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


class StepRole(enum.StrEnum):
    """What a step's process is to the replica."""

    #: The model server: the process that listens on ``Launch.port``.
    SERVER = "server"
    #: ``ray start --head``: rank 0's GCS, which the other nodes join.
    RAY_HEAD = "ray-head"
    #: ``ray start --address``: a rank > 0 lending its GPUs to rank 0's vLLM.
    RAY_WORKER = "ray-worker"
    #: A bounded wait for another node (the head's port open, all nodes joined).
    WAIT = "wait"


class Lifetime(enum.StrEnum):
    """Whether the supervisor waits for a step or keeps it."""

    #: Must exit 0 within ``timeout_s`` before the next step starts.
    RUN_TO_EXIT = "run-to-exit"
    #: Started, then kept alive; its exit fails the whole plan.
    KEEP_RUNNING = "keep-running"


@dataclass(frozen=True, slots=True)
class Step:
    """One process of a plan."""

    #: Short and stable (``vllm``, ``ray-head``, ``wait-ray-nodes``): a log source name.
    name: str
    #: The command; ``argv[0]`` is looked up on PATH when it has no slash.
    argv: tuple[str, ...]
    role: StepRole
    lifetime: Lifetime
    #: Additions to the supervisor's environment (the operator's ``Launch.env`` included).
    env: Mapping[str, str] = field(default_factory=dict)
    #: RUN_TO_EXIT only: kill the process and fail the plan after this many seconds.
    timeout_s: float | None = None
    #: SIGTERM to SIGKILL when stopping, in seconds.
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"step {self.name!r} has an empty argv")
        if (self.lifetime is Lifetime.RUN_TO_EXIT) != (self.timeout_s is not None):
            raise ValueError(f"step {self.name!r}: timeout_s is for RUN_TO_EXIT steps, and "
                             "every RUN_TO_EXIT step needs one")
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


@dataclass(frozen=True, slots=True)
class DeepCheck:
    """A request that proves the model answers, not only that the socket is open.

    vLLM's ``/health`` only says the engine process lives (reference §4); one
    generated token says the weights are loaded and the GPUs work.
    """

    method: str
    path: str
    #: The JSON body, or None for a bodiless request.
    body: Mapping[str, Any] | None
    #: Bound on one check, in seconds. The first request after loading may
    #: compile kernels, so it is generous.
    timeout_s: float = 60.0

    def passed(self, status: int, payload: Any) -> bool:
        """Whether a response to this check shows a working model.

        Args:
            status: the HTTP status.
            payload: the decoded JSON body (anything, if it was not JSON).

        Returns:
            True for a 200 carrying at least one choice and a usage record.
        """
        if status != 200 or not isinstance(payload, dict):
            return False
        choices = payload.get("choices")
        return isinstance(choices, list) and bool(choices) and isinstance(
            payload.get("usage"), dict
        )


def completion_check(served_name: str) -> DeepCheck:
    """One token from ``/v1/completions``.

    Completions rather than chat: a base model without a chat template fails
    chat requests in vLLM, yet serves completions.
    """
    body = {"model": served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    return DeepCheck(method="POST", path="/v1/completions", body=MappingProxyType(body))


@dataclass(frozen=True, slots=True)
class RuntimePlan:
    """The processes to run on this VMI and how to judge them (see the module docstring)."""

    runtime: Runtime
    steps: tuple[Step, ...]
    #: True when this VMI runs the HTTP model server; False for a multi-node
    #: vLLM rank > 0, which is healthy while its KEEP_RUNNING steps live.
    listens: bool
    #: ``http://127.0.0.1:PORT`` when ``listens``, else None.
    base_url: str | None
    #: ``/health`` when ``listens``, else None. 200 means up; vLLM answers 503
    #: once its engine died.
    health_path: str | None
    #: The tiny request sent once /health is 200; None when there is no cheap
    #: one (speech) or no server here.
    deep_check: DeepCheck | None
    #: Bound on model loading: from the server step's start to /health 200
    #: (for a plan that does not listen: to its KEEP_RUNNING steps being up).
    startup_timeout_s: float

    def __post_init__(self) -> None:
        servers = [step for step in self.steps if step.role is StepRole.SERVER]
        if self.listens != bool(servers) or len(servers) > 1:
            raise ValueError("a plan that listens has exactly one SERVER step; others none")
        if self.listens != (self.base_url is not None and self.health_path is not None):
            raise ValueError("base_url and health_path go with listens")

    @property
    def server(self) -> Step | None:
        """The model server step, if this VMI runs one."""
        return next((step for step in self.steps if step.role is StepRole.SERVER), None)

    @property
    def kept(self) -> tuple[Step, ...]:
        """The steps that must stay alive for the plan to be healthy."""
        return tuple(step for step in self.steps if step.lifetime is Lifetime.KEEP_RUNNING)


class RuntimeAdapter(Protocol):
    """Turns a :class:`Launch` into a :class:`RuntimePlan`; pure, no I/O."""

    runtime: Runtime

    def plan(self, launch: Launch) -> RuntimePlan:
        """The plan for ``launch``.

        Raises:
            AdapterError: a subclass naming the field this runtime cannot accept.
        """
        ...


def gpus_per_node(replica_gpus: int, node_count: int) -> int:
    """GPUs each VMI of a replica holds: every node gives the same number (architecture.txt).

    For whoever builds a Launch from a replica's total.

    Raises:
        GpuLayoutError: ``replica_gpus`` is not a positive multiple of ``node_count``.
    """
    if node_count < 1:
        raise TopologyError("node_count", f"must be 1 or more, not {node_count}")
    if replica_gpus < 1 or replica_gpus % node_count:
        raise GpuLayoutError(
            "gpus",
            f"a replica of {replica_gpus} GPUs does not split evenly over {node_count} nodes",
        )
    return replica_gpus // node_count


def check_extra_args(
    extra_args: Sequence[str], managed: Sequence[str], *, runtime: str
) -> None:
    """Refuse operator flags that would override the adapter's own.

    ``--port 9`` and ``--port=9`` are both caught; so is any unambiguous
    prefix argparse would expand (``--por``), since vLLM's parser allows
    abbreviations.

    Raises:
        ManagedFlagError: naming the flag.
    """
    problem = managed_flag_problem(runtime, list(extra_args), tuple(managed))
    if problem is not None:
        raise ManagedFlagError("extra_args", problem, runtime=runtime)


def merged_env(*layers: Mapping[str, str]) -> Mapping[str, str]:
    """Later layers win; the operator's ``Launch.env`` goes last."""
    out: dict[str, str] = {}
    for layer in layers:
        out.update(layer)
    return MappingProxyType(out)
