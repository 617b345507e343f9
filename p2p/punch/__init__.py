"""Hole punching: relayed connections move to direct TCP paths, keeping the session.

See ``README.md`` in this folder.
"""

from ._messages import Connect, PunchMessageError, Skip, Sync
from ._proof import PathProofError
from ._service import PROTOCOL, HolePunchService, PunchConfig, PunchMetrics, prove_path
from ._tcp import PunchSocket, simultaneous_open

__all__ = [
    "PROTOCOL",
    "Connect",
    "HolePunchService",
    "PathProofError",
    "PunchConfig",
    "PunchMessageError",
    "PunchMetrics",
    "PunchSocket",
    "Skip",
    "Sync",
    "prove_path",
    "simultaneous_open",
]
