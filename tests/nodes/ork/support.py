"""wrk-ork's RPC service over a small world for the tests, and a client of it as a
given caller (app-node by default)."""

from __future__ import annotations

from contracts.operations import ReplicaReport
from contracts.ork import PROTOCOL
from nodes.ork.service import OrkService
from tests.p2p.mux_pairs import rpc_client_of

from .world import RACK, World

APP_NODE = b"\x01" * 32
STRANGER = b"\x02" * 32


class Harness:
    """wrk-ork's service over a world of two 4-GPU nodes; only app-node may call it."""

    def __init__(self) -> None:
        self.world = World(nodes=(4, 4))
        self.changes = 0
        self.service = OrkService(self.world.orch, allow=lambda key: key == APP_NODE,
                                  clock=lambda: self.world.now, on_change=self._changed)

    def _changed(self) -> None:
        self.changes += 1

    def report(self, job_id: str, replica: int, state: str) -> None:
        """The daemon applies a worker's report and pumps the events."""
        world = self.world
        world.now += 1
        world.orch.on_report(RACK, ReplicaReport(job_id=job_id, replica=replica, state=state,
                                                 at=world.now), world.now)
        self.service.pump()


def connect(nursery, harness: Harness, key: bytes | None = APP_NODE):
    return rpc_client_of(nursery, harness.service.router, key, protocol=PROTOCOL)
