"""The vLLM adapter: ``vllm serve`` on one node, or Ray plus ``vllm serve`` across nodes.

GPU layout (reference §4, vLLM's distributed_serving.md): a replica of
``node_count`` VMIs with ``gpus`` GPUs each runs with tensor parallelism over
the GPUs of a node (NVLink inside a node is fast) and pipeline parallelism
over the nodes (only activations cross InfiniBand)::

    --tensor-parallel-size = gpus per node     --pipeline-parallel-size = node_count

Multi-node start-up uses Ray, as vLLM documents, in this order:

    rank 0                                    rank r > 0
    ------                                    ----------
    1 ray start --head --block   (keep)       1 ray_wait --reachable HEAD:PORT (exit)
    2 ray_wait --nodes N --gpus N*G (exit)    2 ray start --address HEAD:PORT --block (keep)
    3 vllm serve … --distributed-executor-backend ray (keep, listens)

``--block`` keeps each ``ray start`` in the foreground, so the supervisor owns
it: its output is captured as Application logs and its death is seen (without
``--block``, ``ray start`` daemonises and returns, and a dead raylet would go
unnoticed until vLLM hangs). Step 2 on rank 0 exists because vLLM places one
Ray actor per GPU and fails at once if the cluster is short of GPUs; waiting
for ``N*G`` GPUs in ``ray status`` makes that a bounded, named wait instead of
a crash loop. Ranks > 0 serve no HTTP; they are healthy while their Ray worker
lives, and rank 0's deep check is what proves the whole replica works.

Environment (every node, on the ``ray start`` step, because vLLM's Ray
workers inherit the raylet's environment):

- ``VLLM_HOST_IP``: this node's overlay address; vLLM's docs require it
  unique per node when a VMI has several interfaces.
- ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` / ``TP_SOCKET_IFNAME``: the
  overlay interface, so NCCL's bootstrap and Gloo do not pick the pod network.
- ``NCCL_IB_HCA``: the InfiniBand HCAs (``mlx5``). Check ``NCCL_DEBUG=TRACE``
  logs for ``NET/IB/GDRDMA`` (good) against ``NET/Socket`` (slow).
- ``RAY_ADDRESS`` on ``vllm serve``: vLLM's ``ray.init()`` joins the head
  started in step 1 instead of starting a private cluster.
- ``RAY_USAGE_STATS_ENABLED=0``: no telemetry from inside a customer's VMI.

Ray's inter-node traffic is unencrypted and can run arbitrary code
(distributed_serving.md): the head must listen on the private overlay only,
which is why ``--node-ip-address`` is the overlay address and never 0.0.0.0.

Not used: vLLM's Ray-free multi-node mode (``--nnodes --node-rank
--master-addr``, newer vLLM) would drop the Ray steps; it is not in every
vLLM an image may carry, so Ray stays the default.
"""

from __future__ import annotations

from collections.abc import Mapping

from contracts.model import Runtime
from contracts.runtime_settings import MANAGED_FLAGS

from ._errors import GpuLayoutError, TopologyError
from ._plan import (
    DEFAULT_STOP_TIMEOUT_S,
    Launch,
    Lifetime,
    RuntimePlan,
    Step,
    StepRole,
    check_extra_args,
    completion_check,
    merged_env,
)

__all__ = ["VLLM_MANAGED_FLAGS", "VllmAdapter"]

#: Flags the adapter sets; ``extra_args`` may not repeat them (the list lives
#: in contracts, where app-node refuses them before a job is created).
VLLM_MANAGED_FLAGS = MANAGED_FLAGS[Runtime.VLLM]
#: Loading a 70B model over two nodes (download cache warm) takes minutes;
#: cold caches and torch.compile make it longer. Half an hour is vLLM's own
#: order of magnitude for large models, and the operator can override it.
DEFAULT_VLLM_STARTUP_S = 1800.0
#: Slack on a wait step's own deadline, so it reports its own clear error
#: before the supervisor has to kill it.
_WAIT_SLACK_S = 30.0


class VllmAdapter:
    """Plans ``vllm serve`` (and Ray on multi-node replicas).

    Args:
        vllm: the ``vllm`` command (an image may carry it elsewhere than PATH).
        ray: the ``ray`` command.
    """

    runtime = Runtime.VLLM

    def __init__(self, *, vllm: str = "vllm", ray: str = "ray") -> None:
        self.vllm = vllm
        self.ray = ray

    def plan(self, launch: Launch) -> RuntimePlan:
        """The steps for this VMI of a vLLM replica.

        Raises:
            GpuLayoutError: ``gpus`` is 0.
            TopologyError: a multi-node replica without ``head_address``, or a
                rank 0 whose ``node_address`` is not the head's.
            ManagedFlagError: ``extra_args`` sets a flag listed in
                :data:`VLLM_MANAGED_FLAGS`.
        """
        name = self.runtime.value
        if launch.gpus < 1:
            raise GpuLayoutError("gpus", "vLLM needs at least one GPU on every node",
                                 runtime=name)
        check_extra_args(launch.extra_args, VLLM_MANAGED_FLAGS, runtime=name)
        startup = launch.startup_timeout_s or DEFAULT_VLLM_STARTUP_S
        if not launch.multi_node:
            server = self._serve(launch, merged_env(launch.env))
            return _listening(launch, (server,), startup)
        if not launch.head_address:
            raise TopologyError(
                "head_address", f"a replica of {launch.node_count} nodes needs the rank-0 "
                "VMI's overlay address", runtime=name)
        node_address = launch.node_address
        if launch.node_rank == 0:
            if node_address not in (None, launch.head_address):
                raise TopologyError(
                    "node_address", f"rank 0 is the head: {node_address!r} is not "
                    f"head_address {launch.head_address!r}", runtime=name)
            node_address = launch.head_address
        env = merged_env(_network_env(launch, node_address), launch.env)
        if launch.node_rank == 0:
            steps = (self._ray_head(launch, env), self._wait_nodes(launch),
                     self._serve(launch, merged_env(env, {"RAY_ADDRESS": launch.ray_address},
                                                    launch.env)))
            return _listening(launch, steps, startup)
        steps = (self._wait_head(launch), self._ray_worker(launch, node_address, env))
        return RuntimePlan(runtime=self.runtime, steps=steps, listens=False, base_url=None,
                           health_path=None, deep_check=None,
                           startup_timeout_s=launch.node_wait_timeout_s + _WAIT_SLACK_S)

    def _serve(self, launch: Launch, env: Mapping[str, str]) -> Step:
        argv = [
            self.vllm, "serve", launch.model,
            "--host", launch.host,
            "--port", str(launch.port),
            "--served-model-name", launch.served_name,
            "--tensor-parallel-size", str(launch.gpus),
            "--pipeline-parallel-size", str(launch.node_count),
        ]
        if launch.multi_node:
            argv += ["--distributed-executor-backend", "ray"]
        # The supervisor polls /health every few seconds; uvicorn would log
        # each poll as an Application log line. The agent logs requests itself.
        argv.append("--disable-uvicorn-access-log")
        argv += launch.extra_args
        return Step(name="vllm", argv=tuple(argv), role=StepRole.SERVER,
                    lifetime=Lifetime.KEEP_RUNNING, env=env,
                    stop_timeout_s=DEFAULT_STOP_TIMEOUT_S)

    def _ray_head(self, launch: Launch, env: Mapping[str, str]) -> Step:
        argv = (
            self.ray, "start", "--head",
            "--port", str(launch.ray_port),
            "--node-ip-address", str(launch.head_address),
            "--num-gpus", str(launch.gpus),
            "--disable-usage-stats",
            "--block",
        )
        return Step(name="ray-head", argv=argv, role=StepRole.RAY_HEAD,
                    lifetime=Lifetime.KEEP_RUNNING, env=env)

    def _ray_worker(self, launch: Launch, node_address: str | None,
                    env: Mapping[str, str]) -> Step:
        argv = [self.ray, "start", "--address", launch.ray_address]
        if node_address:
            argv += ["--node-ip-address", node_address]
        argv += ["--num-gpus", str(launch.gpus), "--disable-usage-stats", "--block"]
        return Step(name="ray-worker", argv=tuple(argv), role=StepRole.RAY_WORKER,
                    lifetime=Lifetime.KEEP_RUNNING, env=env)

    def _wait_nodes(self, launch: Launch) -> Step:
        argv = (
            launch.python, "-m", "agents.inference.runtimes.ray_wait",
            "--address", launch.ray_address,
            "--nodes", str(launch.node_count),
            "--gpus", str(launch.node_count * launch.gpus),
            "--timeout-s", _seconds(launch.node_wait_timeout_s),
            "--ray", self.ray,
        )
        return Step(name="wait-ray-nodes", argv=argv, role=StepRole.WAIT,
                    lifetime=Lifetime.RUN_TO_EXIT,
                    env={"RAY_USAGE_STATS_ENABLED": "0"},
                    timeout_s=launch.node_wait_timeout_s + _WAIT_SLACK_S)

    def _wait_head(self, launch: Launch) -> Step:
        argv = (
            launch.python, "-m", "agents.inference.runtimes.ray_wait",
            "--address", launch.ray_address,
            "--reachable",
            "--timeout-s", _seconds(launch.node_wait_timeout_s),
        )
        return Step(name="wait-ray-head", argv=argv, role=StepRole.WAIT,
                    lifetime=Lifetime.RUN_TO_EXIT,
                    timeout_s=launch.node_wait_timeout_s + _WAIT_SLACK_S)


def _network_env(launch: Launch, node_address: str | None) -> dict[str, str]:
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    if node_address:
        env["VLLM_HOST_IP"] = node_address
    if launch.overlay_interface:
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            env[name] = launch.overlay_interface
    if launch.ib_hca:
        env["NCCL_IB_HCA"] = launch.ib_hca
    return env


def _seconds(value: float) -> str:
    return f"{value:g}"


def _listening(launch: Launch, steps: tuple[Step, ...], startup_s: float) -> RuntimePlan:
    return RuntimePlan(runtime=Runtime.VLLM, steps=steps, listens=True,
                       base_url=launch.local_url, health_path="/health",
                       deep_check=completion_check(launch.served_name),
                       startup_timeout_s=startup_s)
