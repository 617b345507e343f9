"""Which replica takes the next request: round robin over the healthy ones, with back-off.

Theory of operation
-------------------
:class:`Balancer` is I/O-free: the pool tells it which agents are connected
(:meth:`connected`, :meth:`disconnected`), the routing table which agents
serve which job (:meth:`set_endpoints`), and the request path how each try
went (:meth:`failed`, :meth:`succeeded`); time is an argument. It answers
:meth:`pick`: the next healthy endpoint of a job in round-robin order.

Healthy means: an endpoint of the job (wrk-ork lists it as the rank-0 agent of
an Active replica), connected now, and not in back-off. A try that fails
before its first frame (connection error, ``UNAVAILABLE``, the channel closed)
puts the agent in back-off for ``backoff_s``, doubling with each failure in a
row up to ``backoff_max_s``; a success ends it. When every connected endpoint
is in back-off, the one whose back-off ends first is still offered (a
request tried on a replica that may have recovered beats a certain 503); when
none is connected there is nothing to pick and the caller answers 503.

Round robin: each job keeps a counter; the healthy endpoints, in the order
wrk-ork lists the replicas, are taken at ``counter % n``. A failed agent left
out of the list shifts the others but never skips one twice in a row.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["DEFAULT_BACKOFF_MAX_S", "DEFAULT_BACKOFF_S", "Balancer", "EndpointState"]

#: A failed replica is skipped this long at first (nginx's upstream
#: ``fail_timeout`` is 10 s; ours is shorter because a replica's own agent
#: restarts its server within seconds, and the pool retries elsewhere anyway).
DEFAULT_BACKOFF_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0
#: Jobs whose counters are kept; the table is rebuilt from wrk-ork's jobs, so
#: this only bounds a job table gone mad.
MAX_JOBS = 65_536


@dataclass(slots=True)
class EndpointState:
    """What the balancer knows of one agent."""

    connected: bool = False
    #: Failures in a row since the last success.
    failures: int = 0
    #: Skipped until this time (the caller's clock).
    backoff_until: float = 0.0


class Balancer:
    """Round robin over a job's healthy replicas (see the module doc).

    Args:
        backoff_s: the first back-off after a failure.
        backoff_max_s: the longest one.
    """

    def __init__(self, *, backoff_s: float = DEFAULT_BACKOFF_S,
                 backoff_max_s: float = DEFAULT_BACKOFF_MAX_S) -> None:
        if not 0 < backoff_s <= backoff_max_s:
            raise ValueError("Balancer needs 0 < backoff_s <= backoff_max_s")
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._endpoints: dict[str, tuple[bytes, ...]] = {}
        self._counters: dict[str, int] = {}
        self._agents: dict[bytes, EndpointState] = {}

    # -- what the table and the pool say ------------------------------------------------

    def set_endpoints(self, job_id: str, keys: Iterable[bytes]) -> None:
        """The agents serving ``job_id``, in wrk-ork's replica order."""
        self._endpoints[job_id] = tuple(keys)
        self._counters.setdefault(job_id, 0)
        if len(self._counters) > MAX_JOBS:
            self._counters.pop(next(iter(self._counters)))

    def forget_job(self, job_id: str) -> None:
        self._endpoints.pop(job_id, None)
        self._counters.pop(job_id, None)

    def jobs(self) -> list[str]:
        return list(self._endpoints)

    def connected(self, key: bytes) -> None:
        """The agent's RPC channel is up."""
        self._state(key).connected = True

    def disconnected(self, key: bytes) -> None:
        """The agent's connection ended; it is not picked until it is back."""
        state = self._agents.get(key)
        if state is not None:
            state.connected = False

    def forget_agent(self, key: bytes) -> None:
        """wrk-ork lists the agent no more: drop what we knew of it."""
        self._agents.pop(key, None)

    # -- what the request path says -------------------------------------------------------

    def failed(self, key: bytes, now: float) -> float:
        """A try on ``key`` failed before its first frame; returns its back-off's end."""
        state = self._state(key)
        state.failures += 1
        wait = min(self.backoff_max_s, self.backoff_s * 2 ** min(state.failures - 1, 30))
        state.backoff_until = now + wait
        return state.backoff_until

    def succeeded(self, key: bytes) -> None:
        """A try on ``key`` got its first frame: it is healthy again."""
        state = self._agents.get(key)
        if state is not None and (state.failures or state.backoff_until):
            state.failures = 0
            state.backoff_until = 0.0

    # -- choosing --------------------------------------------------------------------------

    def pick(self, job_id: str, now: float, exclude: Collection[bytes] = ()) -> bytes | None:
        """The next endpoint of ``job_id`` to try, or None when none is connected.

        Args:
            now: the caller's clock (the one given to :meth:`failed`).
            exclude: agents already tried for this request.
        """
        endpoints = self._endpoints.get(job_id)
        if not endpoints:
            return None
        agents = self._agents
        healthy: list[bytes] = []
        waiting: bytes | None = None
        waiting_until = 0.0
        for key in endpoints:
            state = agents.get(key)
            if state is None or not state.connected or key in exclude:
                continue
            if state.backoff_until <= now:
                healthy.append(key)
            elif waiting is None or state.backoff_until < waiting_until:
                waiting, waiting_until = key, state.backoff_until
        if healthy:
            count = self._counters.get(job_id, 0)
            self._counters[job_id] = count + 1
            return healthy[count % len(healthy)]
        return waiting

    def healthy(self, job_id: str, now: float) -> int:
        """Endpoints of ``job_id`` connected and not in back-off (a metric)."""
        agents = self._agents
        return sum(1 for key in self._endpoints.get(job_id, ())
                   if (state := agents.get(key)) is not None and state.connected
                   and state.backoff_until <= now)

    def state(self, key: bytes) -> EndpointState | None:
        return self._agents.get(key)

    def _state(self, key: bytes) -> EndpointState:
        state = self._agents.get(key)
        if state is None:
            state = self._agents[key] = EndpointState()
        return state
