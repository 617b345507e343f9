"""Why an adapter refuses to plan a model server.

::

    AdapterError                 base: .field names the Launch field at fault
    ├── InvalidLaunch            a field is out of range for any runtime
    │   ├── GpuLayoutError       gpus cannot be laid out (none, or not divisible)
    │   ├── TopologyError        node_rank / node_count / head_address / node_address
    │   └── ManagedFlagError     extra_args repeats a flag the adapter sets itself
    └── UnknownRuntime           adapter_for() got a name that is no Runtime

None of these derive from the builtin ``RuntimeError``: a refused plan is a
configuration fault the agent reports (the job fails with the message), not a
bug. Callers branch on the class or on :attr:`AdapterError.field`, never on
the text.
"""

from __future__ import annotations

__all__ = [
    "AdapterError",
    "GpuLayoutError",
    "InvalidLaunch",
    "ManagedFlagError",
    "TopologyError",
    "UnknownRuntime",
]


class AdapterError(Exception):
    """An adapter cannot turn a :class:`Launch` into a plan.

    Attributes:
        field: the ``Launch`` field at fault (``"gpus"``, ``"head_address"``…),
            or ``"runtime"`` for :class:`UnknownRuntime`.
        runtime: the runtime that refused (``"vllm"``…), when one did.
    """

    def __init__(self, field: str, message: str, *, runtime: str | None = None) -> None:
        prefix = f"{runtime}: " if runtime else ""
        super().__init__(f"{prefix}{field}: {message}")
        self.field = field
        self.runtime = runtime
        self.reason = message


class InvalidLaunch(AdapterError):
    """A Launch field is out of range (an empty model, a port of 0…)."""


class GpuLayoutError(InvalidLaunch):
    """The GPUs cannot be laid out: none where the runtime needs some, or a
    replica's GPUs do not split evenly over its nodes."""


class TopologyError(InvalidLaunch):
    """The multi-node description is inconsistent: a rank outside the replica,
    a multi-node replica without the head's address, or a single-node runtime
    asked to span nodes."""


class ManagedFlagError(InvalidLaunch):
    """``extra_args`` sets a flag the adapter owns (``--port``…).

    Allowing it would let the last occurrence win inside the server's own
    argument parser, so the agent would health-check a port nobody listens on.
    """


class UnknownRuntime(AdapterError):
    """``adapter_for`` was given something that is not a :class:`Runtime`."""
