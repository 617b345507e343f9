"""The replica's state from its VMIs and agents: every row of the table in replica_state."""

from __future__ import annotations

import pytest

from contracts.model import ReplicaState
from nodes.k8s_worker.backend import VmiPhase
from nodes.k8s_worker.replica_state import AgentStatus, VmiView, replica_state

P, A = VmiPhase, AgentStatus
RUN_READY = VmiView(P.RUNNING, A.READY)

ROWS = [
    ("a delete not done yet says nothing", "delete", False, False, [RUN_READY], None),
    ("a delete done is deleted", "delete", True, False, [], ReplicaState.DELETED),
    ("a restart in progress is restarting", "run", False, True, [RUN_READY],
     ReplicaState.RESTARTING),
    ("a failed VMI fails the replica", "run", False, False,
     [RUN_READY, VmiView(P.FAILED, A.READY)], ReplicaState.FAILED),
    ("a VMI that stopped by itself fails the replica", "run", False, False,
     [VmiView(P.SUCCEEDED, A.READY)], ReplicaState.FAILED),
    ("a VMI that vanished fails the replica", "run", False, False,
     [VmiView(P.GONE, A.READY)], ReplicaState.FAILED),
    ("an agent that gave up fails the replica", "run", False, False,
     [VmiView(P.RUNNING, A.FAILED)], ReplicaState.FAILED),
    ("a silent agent makes it unknown", "run", False, False,
     [RUN_READY, VmiView(P.RUNNING, A.SILENT)], ReplicaState.UNKNOWN),
    ("a VMI the backend cannot see makes it unknown", "run", False, False,
     [VmiView(P.UNKNOWN, A.READY)], ReplicaState.UNKNOWN),
    ("running and ready everywhere is active", "run", False, False,
     [RUN_READY, RUN_READY], ReplicaState.ACTIVE),
    ("running without the agent's word is still starting", "run", False, False,
     [VmiView(P.RUNNING, A.HELLO)], ReplicaState.STARTING),
    ("one node of two not running yet is starting", "run", False, False,
     [RUN_READY, VmiView(P.BOOTING, A.NONE)], ReplicaState.STARTING),
    ("an importing disk is starting", "run", False, False,
     [VmiView(P.PROVISIONING, A.NONE)], ReplicaState.STARTING),
    ("a ready agent on a VMI still scheduling is starting", "run", False, False,
     [VmiView(P.SCHEDULING, A.READY)], ReplicaState.STARTING),
]


@pytest.mark.parametrize(("desired", "removed", "restarting", "vmis", "expected"),
                         [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_replica_state(desired, removed, restarting, vmis, expected):
    assert replica_state(desired=desired, removed=removed, restarting=restarting,
                         vmis=vmis) == expected
