"""Runtime adapters: what agent-inference runs for a job's model server, and how to check it.

``adapter_for(runtime).plan(launch)`` gives a :class:`RuntimePlan`: ordered
process :class:`Step` s plus the health contract. Adapters are pure; the
supervisor (``agents/inference/_supervisor.py``) runs the plan. See README.md.
"""

from __future__ import annotations

from contracts.model import Runtime

from ._errors import (
    AdapterError,
    GpuLayoutError,
    InvalidLaunch,
    ManagedFlagError,
    TopologyError,
    UnknownRuntime,
)
from ._plan import (
    DEFAULT_RAY_PORT,
    DeepCheck,
    Launch,
    Lifetime,
    RuntimeAdapter,
    RuntimePlan,
    Step,
    StepRole,
    gpus_per_node,
)
from ._single import LocalAdapter, ParakeetAdapter
from ._vllm import VllmAdapter

__all__ = [
    "DEFAULT_RAY_PORT",
    "AdapterError",
    "DeepCheck",
    "GpuLayoutError",
    "InvalidLaunch",
    "Launch",
    "Lifetime",
    "LocalAdapter",
    "ManagedFlagError",
    "ParakeetAdapter",
    "RuntimeAdapter",
    "RuntimePlan",
    "Step",
    "StepRole",
    "TopologyError",
    "UnknownRuntime",
    "VllmAdapter",
    "adapter_for",
    "gpus_per_node",
]


def adapter_for(runtime: Runtime | str) -> RuntimeAdapter:
    """The adapter of ``runtime`` (a :class:`Runtime` or its value, ``"vllm"``…).

    Raises:
        UnknownRuntime: ``runtime`` names no runtime.
    """
    try:
        which = Runtime(runtime)
    except ValueError:
        known = ", ".join(member.value for member in Runtime)
        raise UnknownRuntime("runtime", f"{runtime!r} is not one of {known}") from None
    if which is Runtime.VLLM:
        return VllmAdapter()
    if which is Runtime.PARAKEET:
        return ParakeetAdapter()
    return LocalAdapter()
