"""Why ``cosmicac doctor`` could not judge the cluster at all.

::

    DoctorError                 base: nothing was checked
    ├── SettingsError           no usable kubeconfig / in-cluster configuration
    └── ApiUnreachable          the API server did not answer (refused, timed out)

A check that fails is not an error: it is a :class:`~._checks.Check` whose
status is ``FAILED``.
"""

from __future__ import annotations

__all__ = ["ApiUnreachable", "DoctorError", "SettingsError"]


class DoctorError(Exception):
    """The doctor could not run its checks."""


class SettingsError(DoctorError):
    """The client could not be configured (no kubeconfig, a bad context...)."""


class ApiUnreachable(DoctorError):
    """The API server at ``server`` did not answer; ``reason`` says how it failed."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"the Kubernetes API at {server} cannot be reached: {reason}")
        self.server = server
        self.reason = reason
