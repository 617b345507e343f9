"""Hole punching: relayed connections move to direct TCP paths, keeping the session.

See ``README.md`` in this folder.
"""

from p2p.lazy import lazy_names

from ._proof import PathProofError
from ._service import PROTOCOL, HolePunchService, PunchConfig, PunchMetrics, prove_path
from ._tcp import PunchSocket, simultaneous_open

#: The signalling messages are pydantic models: imported on first use (PEP 562), so a
#: swarm that never punches (``cosmicac shell`` at an address) does not load pydantic.
_LAZY = {"Connect": "._messages", "PunchMessageError": "._messages", "Skip": "._messages",
         "Sync": "._messages"}


__getattr__ = lazy_names(__name__, _LAZY, globals())


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
