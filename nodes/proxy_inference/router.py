"""The routing table: which job answers a team's model, and which agents may serve it.

A pure function of wrk-ork's job views (:meth:`RoutingTable.from_jobs`); the
daemon rebuilds it whenever the views change and swaps it in whole, so a
request reads one consistent table without locks.

Rules (DESIGN.md §4, seeds/jobs.txt):

- a request's ``model`` is a job's *served name* (``JobSpec.serves_as``: the
  job's own ``served_name``, else its model); names are per team, and wrk-ork
  refuses two live jobs of one team with one name (``CONFLICT``);
- **Active** and **Degraded** inference jobs take requests (a Degraded job
  still has replicas that run), and so does a **Starting** or **Restarting**
  job that has an Active replica: wrk-ork derives a job's status as Starting
  while any one replica (re)starts, so a single model server's crash (its
  agent reports the replica starting again until the server is back) would
  otherwise turn into 404s for the whole job while its other replicas serve;
  ``/v1/models`` lists the team's **Active** jobs;
- a replica's endpoint is its rank-0 agent (``ReplicaView.agents[0]``: the
  node that runs the model server; the other ranks of a multi-node vLLM
  replica only join its Ray cluster), and only replicas wrk-ork reports
  ``active`` are endpoints;
- every agent key wrk-ork lists for a job may pass the swarm's firewall for
  the job's topic (contracts/inference.py: a DHT record proves only that its
  announcer holds some key).

Should two live jobs still share a name (a view between a delete and the
name's reuse), Active wins over Degraded, then the newer job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from contracts.inference import job_topic
from contracts.model import JobStatus, JobType
from contracts.ork import JobView, ReplicaStatus

__all__ = ["ROUTABLE", "Route", "RoutingTable"]

#: Job statuses that take requests.
ROUTABLE = frozenset({JobStatus.ACTIVE, JobStatus.DEGRADED})
#: Job statuses that take requests while at least one replica is Active.
PARTLY_UP = frozenset({JobStatus.STARTING, JobStatus.RESTARTING})
#: Replica statuses whose agent the proxy stays connected to (it may serve
#: again soon); only Active replicas are picked.
_KEEP = frozenset({ReplicaStatus.ACTIVE, ReplicaStatus.STARTING, ReplicaStatus.RESTARTING,
                   ReplicaStatus.UNKNOWN})


@dataclass(frozen=True, slots=True)
class Route:
    """One inference job as the proxy routes to it."""

    job_id: str
    team: str
    served_name: str
    status: JobStatus
    created_at: float
    #: Agent keys that serve requests (rank 0 of each Active replica), by replica.
    endpoints: tuple[bytes, ...]
    #: Agent keys to stay connected to (rank 0 of each replica that is or may
    #: soon be up), so a replica coming back needs no new connection.
    connect: frozenset[bytes]
    #: Every agent key wrk-ork lists for the job (any rank, any replica status).
    agents: frozenset[bytes]
    topic: bytes


@dataclass(frozen=True)
class RoutingTable:
    """Team → served name → route, plus what the firewall and the pool need."""

    #: (team, served name) → route.
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    #: job id → route (every routed job).
    jobs: dict[str, Route] = field(default_factory=dict)
    #: topic → job id.
    topics: dict[bytes, str] = field(default_factory=dict)

    @classmethod
    def from_jobs(cls, jobs: Iterable[JobView]) -> RoutingTable:
        """Build the table from wrk-ork's views (any jobs; non-inference ones are skipped)."""
        routes: dict[tuple[str, str], Route] = {}
        for job in jobs:
            route = _route(job)
            if route is None:
                continue
            slot = (route.team, route.served_name)
            current = routes.get(slot)
            if current is None or _rank(route) > _rank(current):
                routes[slot] = route
        by_job = {route.job_id: route for route in routes.values()}
        return cls(routes=routes, jobs=by_job,
                   topics={route.topic: route.job_id for route in routes.values()})

    def lookup(self, team: str, model: str) -> Route | None:
        """The job serving ``model`` for ``team``, if one takes requests."""
        return self.routes.get((team, model))

    def models(self, team: str) -> list[Route]:
        """The team's Active jobs, by served name (what ``/v1/models`` lists)."""
        return sorted((r for (t, _), r in self.routes.items()
                       if t == team and r.status is JobStatus.ACTIVE),
                      key=lambda r: r.served_name)

    def allows(self, remote_key: bytes, topic: bytes) -> bool:
        """May an announcer found on ``topic`` be dialled (wrk-ork lists it for that job)?"""
        job_id = self.topics.get(topic)
        return job_id is not None and remote_key in self.jobs[job_id].agents

    def endpoint_keys(self) -> frozenset[bytes]:
        """Every agent that serves requests for some routed job."""
        return frozenset(key for route in self.jobs.values() for key in route.endpoints)

    def connect_keys(self) -> frozenset[bytes]:
        """Every agent to stay connected to."""
        return frozenset(key for route in self.jobs.values() for key in route.connect)


def _rank(route: Route) -> tuple[int, int, float, str]:
    return (route.status is JobStatus.ACTIVE, route.status in ROUTABLE, route.created_at,
            route.job_id)


def _route(job: JobView) -> Route | None:
    spec = job.spec
    if spec.type is not JobType.INFERENCE:
        return None
    if job.status not in ROUTABLE and not (
            job.status in PARTLY_UP
            and any(r.status is ReplicaStatus.ACTIVE and r.agents for r in job.replicas)):
        return None
    served = spec.serves_as
    if served is None:  # pragma: no cover - an inference spec always has a model
        return None
    endpoints: list[bytes] = []
    connect: set[bytes] = set()
    agents: set[bytes] = set()
    for replica in job.replicas:
        keys = []
        for hex_key in replica.agents:
            try:
                keys.append(bytes.fromhex(hex_key))
            except ValueError:
                continue  # wrk-ork validated it; never trust a view more than needed
        agents.update(keys)
        if replica.status is ReplicaStatus.ACTIVE and keys:
            endpoints.append(keys[0])
        if replica.status in _KEEP and keys:
            connect.add(keys[0])
    return Route(job_id=job.id, team=spec.team, served_name=served, status=job.status,
                 created_at=job.created_at, endpoints=tuple(endpoints),
                 connect=frozenset(connect),
                 agents=frozenset(agents), topic=job_topic(job.id))
