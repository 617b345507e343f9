"""The trio side of the health history: ask every service on an interval, keep the rows.

A :class:`Target` is a service's name and how to ask it for its
:class:`~contracts.health.ServiceStatus`: over the swarm for wrk-ork and
wrk-monitor (:func:`peer_target`: ``service.status`` through their
:class:`~nodes.kit.peer_client.PeerClient`), or read in process for what app-node
holds itself (:func:`database_target`, :func:`app_node_target`,
:func:`email_target`). A :class:`RowSource` gives the rows of services
app-node learns of through another (:func:`listed_source`: one row per listed
item, at most a bound): each worker from wrk-ork's rack list
(:func:`workers_source`), reachable while wrk-ork hears from it; each proxy
from wrk-monitor's metrics senders (:func:`proxies_source`), reachable while
its last report is at most ``fresh_s`` old, no longer listed once silent for
``forget_s``.

:class:`HealthProber` runs one round every ``interval_s``: every target at
once, each under ``timeout_s``, one row each (:func:`probe`), all added to the
store together; about every ``prune_every_s`` it forgets rows older than
``retention_s``. A target that fails in any way (no connection, a timeout, a
refusal, a bug in a local probe) is a row saying so, never a crash of the
prober; a store that fails is logged (once per outage) and that round's rows
are lost. Rounds keep their schedule; after one that overran (it cannot by
much: every probe is bounded by ``timeout_s`` ≤ ``interval_s``) the next
starts at once and the schedule goes on from there.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import trio

from contracts.health import PROCESS_STARTED_AT, ServiceStatus, service_status
from p2p.rpc import RpcError

from ._model import (
    DEFAULT_INTERVAL_S,
    DEFAULT_TIMEOUT_S,
    PROXY_FORGET_S,
    PROXY_FRESH_S,
    RETENTION_S,
    HealthRow,
    answered,
    not_answered,
)
from ._store import HealthStore, HealthStoreError

if TYPE_CHECKING:
    from contracts.ork import RackInfo
    from crdt import Database, Replicator
    from nodes.kit.peer_client import PeerClient

__all__ = [
    "MAX_PROXY_ROWS",
    "MAX_WORKER_ROWS",
    "HealthProber",
    "ProberStatistics",
    "RowSource",
    "Target",
    "app_node_target",
    "database_status",
    "database_target",
    "email_target",
    "listed_source",
    "peer_target",
    "probe",
    "proxies_source",
    "proxy_row",
    "worker_row",
    "workers_source",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: RPC failures that mean no answer came, not that the peer refused.
_NO_ANSWER = frozenset({"TIMEOUT", "CHANNEL_CLOSED"})
#: Outbox files counted at most (the folder is never pruned; listing it has a cost).
MAX_OUTBOX_COUNT = 100_000


@dataclass(frozen=True)
class Target:
    """A service to probe: its name in the history, and ``ask(timeout_s)``."""

    service: str
    ask: Callable[[float], Awaitable[ServiceStatus]]


@dataclass(frozen=True)
class RowSource:
    """Services app-node does not reach itself but learns of through another:
    each worker, as wrk-ork hears from it. ``rows(at, timeout_s)`` gives one
    row per such service; which ones exist may change from round to round."""

    name: str
    rows: Callable[[float, float], Awaitable[list[HealthRow]]]


async def probe(target: Target, *, timeout_s: float,
                clock: Callable[[], float] = time.time) -> HealthRow:
    """Ask ``target`` once, bounded by ``timeout_s``; its row whatever happens."""
    at = clock()
    start = trio.current_time()

    def elapsed_ms() -> float:
        return (trio.current_time() - start) * 1000.0

    try:
        with trio.fail_after(timeout_s):
            status = await target.ask(timeout_s)
    except trio.TooSlowError:
        return not_answered(target.service, at=at, latency_ms=elapsed_ms(),
                            error=f"no answer within {timeout_s:g} s")
    except RpcError as exc:
        return not_answered(target.service, at=at, latency_ms=elapsed_ms(),
                            error=f"{exc.code}: {exc}", reachable=exc.code not in _NO_ANSWER)
    except Exception as exc:  # an unreachable peer, or a local probe's bug: a row, not a crash
        return not_answered(target.service, at=at, latency_ms=elapsed_ms(),
                            error=f"{type(exc).__name__}: {exc}")
    return answered(status, service=target.service, at=at, latency_ms=elapsed_ms())


def peer_target(client: PeerClient) -> Target:
    """A daemon reached over the swarm (``client.peer``: ``wrk-ork``, ``wrk-monitor``)."""
    return Target(client.peer, lambda timeout_s: client.status(timeout_s=timeout_s))


#: Workers shown at most (one row each per round).
MAX_WORKER_ROWS = 256


def worker_row(rack: RackInfo, at: float) -> HealthRow:
    """A worker as wrk-ork hears it: up while it reports, down once wrk-ork
    found it silent (its jobs are then Unknown) or before its first report."""
    name = f"worker {rack.name or rack.key[:12]}"[:64]
    up = rack.reported and not rack.silent
    error = None if up else ("never reported to wrk-ork" if not rack.reported
                             else "silent: wrk-ork has marked its jobs Unknown")
    return HealthRow(at=at, service=name, reachable=up, last_report_at=rack.last_report_at,
                     error=error, details={"key": rack.key[:16], "location": rack.location,
                                           "nodes": rack.nodes, "gpus": rack.gpus,
                                           "free": rack.free, "jobs": rack.jobs})


def listed_source(name: str, fetch: Callable[[float], Awaitable[Iterable[T]]],
                  to_row: Callable[[T, float], HealthRow | None], limit: int) -> RowSource:
    """A :class:`RowSource` of the items another service lists: ``fetch(timeout_s)``
    them, one ``to_row(item, at)`` each (None: not shown), at most ``limit`` rows.
    Whatever ``fetch`` raises fails the round's source (the prober logs it and
    keeps the last set watched: they go stale)."""
    async def rows(at: float, timeout_s: float) -> list[HealthRow]:
        out: list[HealthRow] = []
        for item in await fetch(timeout_s):
            row = to_row(item, at)
            if row is not None:
                out.append(row)
                if len(out) >= limit:
                    break
        return out

    return RowSource(name, rows)


def workers_source(ork: PeerClient) -> RowSource:
    """Each registered worker's row, from wrk-ork's ``racks.list``."""
    from contracts.ork import LIST_RACKS, Empty

    async def racks(timeout_s: float) -> list[RackInfo]:
        return (await ork.call(LIST_RACKS, Empty(), timeout_s=timeout_s)).racks

    return listed_source("workers", racks, worker_row, MAX_WORKER_ROWS)


#: Proxies shown at most (wrk-monitor lists at most 64 metrics senders).
MAX_PROXY_ROWS = 64


def proxy_row(sender: tuple[str, float], at: float, *, fresh_s: float = PROXY_FRESH_S,
              forget_s: float = PROXY_FORGET_S) -> HealthRow | None:
    """A proxy as wrk-monitor hears it (``sender``: its key's first hex digits
    and the seconds since its last ``metrics.push``, on wrk-monitor's clock):
    up while that is at most ``fresh_s``, down after, None (no row) once
    it is over ``forget_s``. No version: a metrics report carries none."""
    key, age = sender
    if age > forget_s:
        return None
    up = age <= fresh_s
    return HealthRow(at=at, service=f"proxy-inference {key[:12]}", reachable=up,
                     last_report_at=max(at - age, 0.0),
                     error=None if up else (f"silent for {age:.0f} s: no metrics report to "
                                            f"wrk-monitor within {fresh_s:g} s"),
                     details={"key": key[:16], "age_s": round(age, 1)})


def proxies_source(monitor: PeerClient, *, fresh_s: float = PROXY_FRESH_S,
                   forget_s: float = PROXY_FORGET_S) -> RowSource:
    """Each proxy's row, from the metrics senders in wrk-monitor's ``service.status``
    (its ``metrics_sender_ages`` detail), in key order. A wrk-monitor too old to
    list them gives no rows (logged once)."""
    from contracts.monitor import SENDER_AGES, parse_sender_ages

    warned = False

    async def senders(timeout_s: float) -> list[tuple[str, float]]:
        nonlocal warned
        status = await monitor.status(timeout_s=timeout_s)
        listing = status.details.get(SENDER_AGES)
        if not isinstance(listing, str):
            if not warned:
                log.info("health.no_proxy_rows reason=wrk-monitor %s lists no metrics senders "
                         "(older than %s)", status.version, SENDER_AGES)
                warned = True
            return []
        return sorted(parse_sender_ages(listing))

    def row(sender: tuple[str, float], at: float) -> HealthRow | None:
        return proxy_row(sender, at, fresh_s=fresh_s, forget_s=forget_s)

    return listed_source("proxies", senders, row, MAX_PROXY_ROWS)


def database_status(db: Database, replicator: Replicator | None = None) -> ServiceStatus:
    """app-node's replica of the shared database.

    ``queue_depth`` is how far it is behind: entries its peers have said they
    hold and it has not (per writer, the most any peer holds minus ours), plus
    entries held back waiting for what they depend on. ``details``: writers
    admitted, peers connected, entries held.
    """
    lengths, wanted = db.lengths, db.wanted
    behind = 0
    if replicator is not None:
        most: dict[bytes, int] = {}
        for peer in list(replicator.peers.values()):
            for writer, length in peer.lengths.items():
                if writer in wanted:
                    most[writer] = max(most.get(writer, 0), length)
        behind = sum(max(0, n - lengths.get(w, 0)) for w, n in most.items())
    waiting = db.base.gate.waiting
    return service_status("database", started_at=PROCESS_STARTED_AT,
                          queue_depth=behind + waiting, details={
                              "writers": sum(w.admitted for w in db.writers()),
                              "peers": db.peer_count, "entries": sum(lengths.values()),
                              "behind": behind, "waiting": waiting,
                              "writer": db.is_writer, "admin": db.is_admin})


def database_target(db: Database, replicator: Replicator | None = None) -> Target:
    async def ask(timeout_s: float) -> ServiceStatus:
        return database_status(db, replicator)

    return Target("database", ask)


def app_node_target(details: Callable[[], dict] = dict,
                    started_at: float = PROCESS_STARTED_AT) -> Target:
    """app-node itself: answering proves it runs; ``details()`` adds what it knows."""
    async def ask(timeout_s: float) -> ServiceStatus:
        return service_status("app-node", started_at=started_at, details=details())

    return Target("app-node", ask)


def _outbox(folder: Path) -> tuple[int, float | None]:
    """Messages in the outbox folder (up to MAX_OUTBOX_COUNT) and the newest's time."""
    count, newest = 0, None
    try:
        entries = folder.iterdir()
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(".eml"):
                continue
            count += 1
            mtime = entry.stat().st_mtime
            newest = mtime if newest is None else max(newest, mtime)
            if count >= MAX_OUTBOX_COUNT:
                break
    except FileNotFoundError:  # nothing sent yet: the folder is made on the first send
        pass
    return count, newest


def email_target(sender: object) -> Target:
    """app-node's email: with the outbox backend, ``queue_depth`` is the messages
    waiting in its folder for an operator to read or forward and
    ``last_report_at`` the newest; SMTP and SendGrid send at once (no queue)."""
    from ..email import OutboxSender

    async def ask(timeout_s: float) -> ServiceStatus:
        if isinstance(sender, OutboxSender):
            count, newest = await trio.to_thread.run_sync(_outbox, sender.folder)
            return service_status("email", started_at=PROCESS_STARTED_AT, queue_depth=count,
                                  last_report_at=newest, details={"backend": "outbox"})
        backend = type(sender).__name__.removesuffix("Sender").lower() or "custom"
        return service_status("email", started_at=PROCESS_STARTED_AT,
                              details={"backend": backend})

    return Target("email", ask)


@dataclass(frozen=True)
class ProberStatistics:
    rounds: int
    rows: int
    store_errors: int


class HealthProber:
    """Probes ``targets`` every ``interval_s`` into ``store``; what the routes read.

    Args:
        store: where rows go (and where the routes read them).
        targets: the services, in the order the API shows them.
        interval_s / timeout_s: a round's period and each probe's bound (< period).
        retention_s: rows older than this are pruned about every ``prune_every_s``.
        clock: the wall clock rows are stamped with (tests pass a fake).
    """

    def __init__(self, store: HealthStore, targets: Sequence[Target], *,
                 sources: Sequence[RowSource] = (),
                 interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retention_s: float = RETENTION_S, prune_every_s: float = 600.0,
                 clock: Callable[[], float] = time.time) -> None:
        if not 0 < timeout_s <= interval_s:
            raise ValueError("a probe's timeout_s must be positive and at most interval_s")
        self.store = store
        self.targets = tuple(targets)
        self.sources = tuple(sources)
        #: Per source, the services its last answer named (kept while it fails:
        #: they then go stale, which is what is known of them).
        self._sourced: dict[str, tuple[str, ...]] = {}
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.retention_s = retention_s
        self.prune_every_s = prune_every_s
        self.clock = clock
        self._rounds = self._rows = self._store_errors = 0
        self._store_down = False

    @property
    def services(self) -> tuple[str, ...]:
        """The watched services: the targets', then those the sources named last."""
        named = [target.service for target in self.targets]
        for source in self.sources:
            named += [n for n in self._sourced.get(source.name, ()) if n not in named]
        return tuple(named)

    def statistics(self) -> ProberStatistics:
        return ProberStatistics(self._rounds, self._rows, self._store_errors)

    async def probe_all(self) -> list[HealthRow]:
        """One round: every target at once; their rows in the targets' order."""
        rows: list[HealthRow | None] = [None] * len(self.targets)

        async def one(index: int, target: Target) -> None:
            rows[index] = await probe(target, timeout_s=self.timeout_s, clock=self.clock)

        sourced: dict[str, list[HealthRow]] = {}

        async def many(source: RowSource) -> None:
            at = self.clock()
            try:
                with trio.fail_after(self.timeout_s):
                    got = await source.rows(at, self.timeout_s)
            except Exception as exc:  # like a probe: a failing source is no crash
                log.info("health.source_failed source=%s reason=%s", source.name,
                         f"{type(exc).__name__}: {exc}")
                return
            sourced[source.name] = got
            self._sourced[source.name] = tuple(dict.fromkeys(row.service for row in got))

        async with trio.open_nursery() as nursery:
            for index, target in enumerate(self.targets):
                nursery.start_soon(one, index, target)
            for source in self.sources:
                nursery.start_soon(many, source)
        extra = [row for source in self.sources for row in sourced.get(source.name, ())]
        return [row for row in rows if row is not None] + extra

    async def run_once(self, *, prune: bool = False) -> list[HealthRow]:
        """Probe every target, keep the rows (and prune when asked); the rows."""
        rows = await self.probe_all()
        self._rounds += 1
        try:
            await self.store.add(rows)
            if prune:
                await self.store.prune(self.clock() - self.retention_s)
        except HealthStoreError as exc:
            self._store_errors += 1
            if not self._store_down:
                log.warning("health.store_failed reason=%s; rows are lost until it works", exc)
            self._store_down = True
        else:
            self._rows += len(rows)
            if self._store_down:
                log.warning("health.store_recovered")
            self._store_down = False
        for row in rows:
            if not row.up:
                log.info("health.not_up service=%s reachable=%s error=%s", row.service,
                         row.reachable, row.error)
        return rows

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Probe until cancelled; ``started`` at once (the first round follows)."""
        task_status.started()
        next_at = trio.current_time()
        last_prune = -math.inf
        while True:
            prune = trio.current_time() - last_prune >= self.prune_every_s
            if prune:
                last_prune = trio.current_time()
            await self.run_once(prune=prune)
            next_at = max(next_at + self.interval_s, trio.current_time())
            await trio.sleep_until(next_at)
