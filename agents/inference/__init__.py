"""agent-inference: a Managed Inference Job's model server, supervised and served.

- :class:`InferenceWorkload` (``_workload.py``): what an inference job's agent
  runs: the runtime adapter's plan (``runtimes/``: vLLM, Parakeet, local),
  supervised (``_supervisor.py``), announced on the job's DHT topic while
  healthy, and served to proxy-inference over ``cosmicac-inference/1``
  (``_service.py``, ``_forward.py``).
- ``agents.inference.server``: the ``local`` runtime's model server, an
  :class:`~agents.inference.engines.Engine` behind the HTTP API vLLM speaks
  (chat, completions, SSE streaming, usage, embeddings, ``/health``), so the
  agent and the proxy treat the GPU runtime and the CPU one alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["InferenceWorkload", "ModelServerFailed", "ModelSupervisor", "SupervisorPolicy"]

if TYPE_CHECKING:
    from ._supervisor import ModelServerFailed, ModelSupervisor, SupervisorPolicy
    from ._workload import InferenceWorkload


def __getattr__(name: str) -> Any:
    # Lazy: the model server (``python -m agents.inference.server``) imports this
    # package too, and should not pay for the swarm and HTTP client it never uses.
    if name == "InferenceWorkload":
        from ._workload import InferenceWorkload

        return InferenceWorkload
    if name in ("ModelServerFailed", "ModelSupervisor", "SupervisorPolicy"):
        from . import _supervisor

        return getattr(_supervisor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
