"""How a daemon says how it is: the ``service.status`` RPC method.

app-node records every control-plane service's health on an interval
(reachable, version, queue depth, last report). Reachable is whether
the call was answered; the rest is what the service answers here. Every
service that app-node watches over the swarm (wrk-ork's ``cosmicac-ork/1``,
wrk-monitor's ``cosmicac-monitor/1``) serves the same method on its own
channel protocol, so one prober asks them all the same way::

    service.status  StatusRequest() -> ServiceStatus

``details`` carries what is particular to one service (wrk-ork's outbox depth
per rack, wrk-monitor's senders), flat and bounded so that a history row stays
small: at most :data:`MAX_DETAILS` entries of scalars.
"""

from __future__ import annotations

import time
from functools import cache
from importlib import metadata

from pydantic import BaseModel, ConfigDict, Field

from p2p.rpc import Method

__all__ = [
    "MAX_DETAILS",
    "PROCESS_STARTED_AT",
    "STATUS",
    "ServiceStatus",
    "StatusRequest",
    "package_version",
    "service_status",
]

#: Entries of :attr:`ServiceStatus.details`.
MAX_DETAILS = 64

Scalar = int | float | str | bool | None


class StatusRequest(BaseModel):
    """No parameters; a model so that a later version may add some."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ServiceStatus(BaseModel):
    """One service's answer to ``service.status``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The daemon's name, e.g. ``wrk-ork``, ``wrk-monitor``.
    service: str = Field(min_length=1, max_length=64)
    #: The cosmicac package version it runs.
    version: str = Field(min_length=1, max_length=64)
    #: When the daemon started (seconds since the epoch, its clock).
    started_at: float = Field(ge=0)
    #: Work waiting in the service's main queue (wrk-ork: operations not yet
    #: replicated to their racks; wrk-monitor: records waiting for Loki).
    queue_depth: int = Field(default=0, ge=0)
    #: When the service last heard from what reports to it (wrk-ork: the
    #: newest rack report; wrk-monitor: the newest push), or None.
    last_report_at: float | None = Field(default=None, ge=0)
    details: dict[str, Scalar] = Field(default_factory=dict, max_length=MAX_DETAILS)


STATUS = Method("service.status", params=StatusRequest, result=ServiceStatus)


@cache
def package_version() -> str:
    """The installed cosmicac version (``0+unknown`` when run from an uninstalled tree)."""
    try:
        return metadata.version("cosmicac")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def service_status(service: str, *, started_at: float, queue_depth: int = 0,
                   last_report_at: float | None = None,
                   details: dict[str, Scalar] | None = None) -> ServiceStatus:
    """A :class:`ServiceStatus` with this package's version; ``details`` cut to the bound."""
    items = list((details or {}).items())[:MAX_DETAILS]
    return ServiceStatus(service=service, version=package_version(),
                         started_at=max(started_at, 0.0), queue_depth=max(queue_depth, 0),
                         last_report_at=last_report_at, details=dict(items))


#: The process start, for services that have no clock of their own to note it.
PROCESS_STARTED_AT = time.time()
