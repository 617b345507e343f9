"""The single-node runtimes: Parakeet (our NeMo server) and ``local`` (our CPU server).

Both run one of our own Python entry points with the agent's interpreter
(``Launch.python``), so their flags are ours and checked by our tests:

- parakeet: ``python -m agents.inference.runtimes.parakeet_server --model M
  --host H --port P --served-name N --device cuda|cpu``
- local: ``python -m agents.inference.server --model M --host H --port P
  --served-name N``

Neither can span nodes (architecture.txt: only a vLLM replica is multi-node).
"""

from __future__ import annotations

from agents.inference.engines import MODEL_TASKS
from contracts.model import Runtime
from contracts.runtime_settings import MANAGED_FLAGS

from ._errors import TopologyError
from ._plan import (
    Launch,
    Lifetime,
    RuntimePlan,
    Step,
    StepRole,
    check_extra_args,
    completion_check,
    merged_env,
)

__all__ = ["LocalAdapter", "ParakeetAdapter"]

#: Parakeet-TDT 0.6B loads in well under a minute from a warm disk; NeMo
#: downloads the checkpoint on first use when the image lacks it (reference §5).
DEFAULT_PARAKEET_STARTUP_S = 900.0
#: The demo engine loads instantly; a GGUF model from the package cache in seconds.
DEFAULT_LOCAL_STARTUP_S = 120.0


def _generates_text(model: str) -> bool:
    """Whether a ``local`` model answers completions (speech-only ones get no
    completion deep check); an unknown model is left to the server to refuse."""
    return "text" in MODEL_TASKS.get(model, frozenset({"text"}))


def _single_node(launch: Launch, runtime: Runtime) -> None:
    if launch.multi_node:
        raise TopologyError(
            "node_count", f"{runtime.value} runs on one node, not {launch.node_count}",
            runtime=runtime.value)


def _server_argv(launch: Launch, module: str) -> list[str]:
    return [
        launch.python, "-m", module,
        "--model", launch.model,
        "--host", launch.host,
        "--port", str(launch.port),
        "--served-name", launch.served_name,
    ]


class ParakeetAdapter:
    """Plans our NeMo speech-to-text server (``parakeet_server``).

    It uses one GPU (the first one visible) when the VMI has any, else the
    CPU; a VMI with more GPUs leaves the others idle: one Parakeet model
    saturates no more than one GPU.
    """

    runtime = Runtime.PARAKEET

    def plan(self, launch: Launch) -> RuntimePlan:
        """The one-step plan.

        Raises:
            TopologyError: ``node_count`` > 1.
            ManagedFlagError: ``extra_args`` repeats one of our flags.
        """
        _single_node(launch, self.runtime)
        check_extra_args(launch.extra_args, MANAGED_FLAGS[self.runtime], runtime=self.runtime.value)
        argv = _server_argv(launch, "agents.inference.runtimes.parakeet_server")
        argv += ["--device", "cuda" if launch.gpus else "cpu", *launch.extra_args]
        step = Step(name="parakeet", argv=tuple(argv), role=StepRole.SERVER,
                    lifetime=Lifetime.KEEP_RUNNING, env=merged_env(launch.env))
        return RuntimePlan(runtime=self.runtime, steps=(step,), listens=True,
                           base_url=launch.local_url, health_path="/health",
                           # No cheap request proves a speech model: /health is
                           # only answered after the model loaded.
                           deep_check=None,
                           startup_timeout_s=launch.startup_timeout_s
                           or DEFAULT_PARAKEET_STARTUP_S)


class LocalAdapter:
    """Plans the ``local`` CPU model server (``agents.inference.server``); GPUs are ignored."""

    runtime = Runtime.LOCAL

    def plan(self, launch: Launch) -> RuntimePlan:
        """The one-step plan.

        Raises:
            TopologyError: ``node_count`` > 1.
            ManagedFlagError: ``extra_args`` repeats one of our flags.
        """
        _single_node(launch, self.runtime)
        check_extra_args(launch.extra_args, MANAGED_FLAGS[self.runtime], runtime=self.runtime.value)
        argv = [*_server_argv(launch, "agents.inference.server"), *launch.extra_args]
        step = Step(name="local", argv=tuple(argv), role=StepRole.SERVER,
                    lifetime=Lifetime.KEEP_RUNNING, env=merged_env(launch.env))
        speech = not _generates_text(launch.model)
        return RuntimePlan(runtime=self.runtime, steps=(step,), listens=True,
                           base_url=launch.local_url, health_path="/health",
                           deep_check=None if speech else completion_check(launch.served_name),
                           startup_timeout_s=launch.startup_timeout_s
                           or DEFAULT_LOCAL_STARTUP_S)
