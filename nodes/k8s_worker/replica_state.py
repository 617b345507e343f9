"""A replica's state from its VMIs' phases and its agents' reports (pure).

The issue's rule: Active only when the agent says it is ready; Unknown when
the reports stop. The backend alone cannot say a replica serves (a VMI in
``Running`` may still be booting its guest), and the agent alone cannot say
it failed (a crashed VMI sends nothing), so both are read:

========================================  ===========
VMIs (phases) / agents                    replica
========================================  ===========
a delete was asked, not done yet          (no report)
a delete was asked and done               DELETED
a restart was asked, not done yet         RESTARTING
any VMI Failed/Succeeded, or agent failed FAILED
any VMI gone after it was created         FAILED
any agent silent, or any VMI Unknown      UNKNOWN
every VMI Running and every agent ready   ACTIVE
otherwise                                 STARTING
========================================  ===========
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from contracts.model import ReplicaState

from .backend import VmiPhase

__all__ = ["AgentStatus", "VmiView", "replica_state"]


class AgentStatus(enum.StrEnum):
    """What a VMI's agent last told the worker."""

    #: Nothing yet (or since the VMI was replaced).
    NONE = "none"
    #: Proved which replica it is; not ready yet.
    HELLO = "hello"
    #: Ready to serve.
    READY = "ready"
    #: Gave up (its own report).
    FAILED = "failed"
    #: Heartbeats stopped.
    SILENT = "silent"


@dataclass(frozen=True)
class VmiView:
    """The worker's latest knowledge of one VMI."""

    phase: VmiPhase = VmiPhase.PROVISIONING
    agent: AgentStatus = AgentStatus.NONE


def replica_state(*, desired: str, removed: bool, restarting: bool,
                  vmis: list[VmiView]) -> ReplicaState | None:
    """The state to report, or None when there is nothing to say yet."""
    if desired == "delete":
        return ReplicaState.DELETED if removed else None
    if restarting:
        return ReplicaState.RESTARTING
    if any(view.phase in (VmiPhase.FAILED, VmiPhase.SUCCEEDED, VmiPhase.GONE)
           or view.agent is AgentStatus.FAILED for view in vmis):
        return ReplicaState.FAILED
    if any(view.agent is AgentStatus.SILENT or view.phase is VmiPhase.UNKNOWN
           for view in vmis):
        return ReplicaState.UNKNOWN
    if vmis and all(view.phase is VmiPhase.RUNNING and view.agent is AgentStatus.READY
                    for view in vmis):
        return ReplicaState.ACTIVE
    return ReplicaState.STARTING
