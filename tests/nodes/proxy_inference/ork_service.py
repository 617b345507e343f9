"""wrk-ork's real service on a swarm for the proxy's tests, its orchestrator driven
by the test as replica reports arrive."""

from __future__ import annotations

from contracts.model import ReplicaState
from contracts.operations import ReplicaReport
from nodes.ork.access import OrkAccess
from nodes.ork.service import OrkService
from p2p.keys import KeyPair
from tests.nodes.ork.world import RACK, World


class Ork:
    """wrk-ork's service on a swarm, its orchestrator driven by the test as reports arrive."""

    def __init__(self, proxies: set[bytes]) -> None:
        self.world = World(nodes=(8,))
        # The proxy role, as wrk-ork's ``proxies`` setting gives it: the
        # proxy reads and follows jobs with nothing more.
        access = OrkAccess(proxies=frozenset(proxies))
        self.service = OrkService(self.world.orch, roles=access.roles_of,
                                  clock=lambda: self.world.now)
        self.keypair = KeyPair.generate()

    def report(self, job_id: str, replica: int, state: str, agents: tuple[bytes, ...] = ()):
        world = self.world
        world.now += 1
        generation = next(r.generation for r in world.orch.get_job(job_id).replicas
                          if r.index == replica)
        world.orch.on_report(RACK, ReplicaReport(
            job_id=job_id, replica=replica, state=ReplicaState(state), generation=generation,
            agents=tuple(a.hex() for a in agents), at=world.now), world.now)
        self.service.pump()
