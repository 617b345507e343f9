"""The Loki (and Prometheus) wrk-monitor uses now, swapped at runtime.

Theory of operation
-------------------
"cosmicac-app-node sends cosmicac-wrk-monitor the URLs of your Loki and
Prometheus" (seeds/architecture.txt, Observability). :class:`ObservabilityHolder`
owns the current :class:`~nodes.monitor.loki.LokiPusher` and
:class:`~nodes.monitor.loki.LokiReader` pair, and runs each pusher in a
nursery of its own (:meth:`ObservabilityHolder.run`). Everything else reads
through it, so nothing holds a pusher or reader across a swap: the service's
``on_records`` hook (:meth:`~ObservabilityHolder.offer`), ``logs.query``'s and
the HTTP side's history (:attr:`~ObservabilityHolder.reader`), ``/metrics`` and
``service.status`` (:meth:`~ObservabilityHolder.statistics`).

Precedence at start: what app-node last sent (``<storage>/observability.json``,
so a restarted wrk-monitor pushes to Loki before app-node reconnects), else
wrk-monitor's own ``loki`` settings, else no Loki. A file that cannot be read or
validated is logged and ignored. An ``observability.set`` replaces what is in
force (logged with the URLs' credentials stripped) and is written to the file
first (atomically: a temporary file, fsync, rename, mode 0600 since a URL may
hold a password); a failed write is logged, the new value still applies until
a restart, and ``persisted`` says so.

Clearing (:meth:`~ObservabilityHolder.clear`, ``observability.clear``): app-node
sends it on each connection when none of its ``observability`` settings is
set, so an operator who removes them stops wrk-monitor using the old Loki. What
app-node sent is forgotten: the file is deleted and wrk-monitor's own ``loki``
settings come back in force (origin ``settings``), or no Loki (``none``). The
settings stay the operator's per-monitor value: app-node only replaces them
while it has one of its own. Clearing what is already in force (app-node never
sent anything) changes nothing and logs nothing. A file that cannot be deleted is
logged: the clear applies until a restart, which would read the old value back.

Swap semantics (:meth:`~ObservabilityHolder.set`):

- the same Loki URL and tenant again (app-node sends on every connection):
  nothing changes, the pusher keeps its buffer and counters;
- a new Loki URL or tenant: a new pusher starts at once, and the records the old
  one still buffered are **handed over** to it (in order, before anything
  offered later), so they go to the new Loki. The old pusher only finishes the
  batch in flight, for at most ``grace_s`` (default 5 s); then it is cancelled;
- Loki cleared (``loki_url`` None): the old pusher **flushes** what it buffered
  to the old Loki, best effort, for at most ``grace_s``; offers made meanwhile are
  not taken (there is no Loki any more).

What a retired pusher still held when its grace ran out (its batch in flight
and, on a clear, its buffer) is counted as ``dropped``. The old reader is
closed at the same time (a history read still using it then fails, and its
answer says ``loki-error``). Counters are cumulative across swaps (retired
pushers' figures are folded in), so ``monitor_loki_*_total`` never goes back.

The Prometheus URL is kept, persisted and reported (``service.status`` and
``observability.get``); :attr:`~ObservabilityHolder.prometheus` reads a job's
metrics back from it (:mod:`.prometheus`, the HTTP side's ``/jobs/{id}/metrics``),
over one HTTP client the holder owns, so a new URL needs nothing closed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pydantic
import trio

from contracts.monitor import LogRecord, Observability, ObservabilityState, redact_url
from nodes.kit.tls import client_tls
from p2p.daemon import sync_directory, write_atomically

from .loki import LokiPusher, LokiPusherStatistics, LokiReader, LokiRecord
from .prometheus import PrometheusReader

__all__ = ["DEFAULT_GRACE_S", "OBSERVABILITY_FILE", "ObservabilityHolder", "load_persisted",
           "remove_persisted", "save_persisted", "to_loki"]

log = logging.getLogger(__name__)

#: What app-node last sent, under wrk-monitor's storage.
OBSERVABILITY_FILE = "observability.json"
#: How long a replaced pusher may finish (or, on a clear, flush) before it is cut.
#: One batch's round trip is milliseconds; 5 s covers a slow Loki without
#: holding an unreachable one's retries (up to minutes of backoff) for long.
DEFAULT_GRACE_S = 5.0


def to_loki(record: LogRecord, cursor: str = "") -> LokiRecord:
    """The Loki form of ``record``: a record of no job is labelled ``job_id=""``
    (Loki drops empty labels: it is then selected by ``service`` alone); ``cursor``
    its number in its job (kept as structured metadata)."""
    # Positional: built for every record accepted while Loki is on.
    return LokiRecord(record.time_ns, record.service, record.source, record.job_id or "",
                      record.text, cursor)


def load_persisted(storage: Path) -> Observability | None:
    """What app-node last sent, or None: no file, or one that is not valid (logged).

    Blocking (a file read): call it in a thread from trio.
    """
    path = storage / OBSERVABILITY_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("monitor.observability.unreadable path=%s error=%s (ignored)", path, exc)
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.pop("version", None) != 1:
            raise ValueError("not a version 1 object")
        return Observability.model_validate(data)
    except (ValueError, pydantic.ValidationError) as exc:
        log.warning("monitor.observability.corrupt path=%s error=%s (ignored; app-node sends "
                    "it again when it connects)", path, str(exc).splitlines()[0])
        return None


def save_persisted(storage: Path, value: Observability) -> None:
    """Write ``value`` to ``<storage>/observability.json`` atomically (mode 0600).

    Blocking: call it in a thread. Raises OSError.
    """
    body = json.dumps({"version": 1, **value.model_dump()}, indent=2).encode()
    write_atomically(storage / OBSERVABILITY_FILE, body, durable=True)


def remove_persisted(storage: Path) -> bool:
    """Delete ``<storage>/observability.json``; whether there was one.

    Blocking: call it in a thread. Raises OSError (other than a missing file).
    """
    path = storage / OBSERVABILITY_FILE
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    sync_directory(storage)  # the deletion survives a crash
    return True


@dataclass
class _Pair:
    """One Loki's pusher and reader, and the scope its pusher task runs in."""

    pusher: LokiPusher
    reader: LokiReader
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ended: trio.Event = field(default_factory=trio.Event)


class ObservabilityHolder:
    """The Loki pusher and reader in force, swapped by :meth:`set` (see the module doc).

    Args:
        start: the value in force at start (see :meth:`from_storage`).
        origin: where ``start`` came from (``settings``, ``file``, ``none``).
        settings: wrk-monitor's own ``loki`` settings (None: no Loki), what
            :meth:`clear` goes back to.
        storage: where :meth:`set` persists what it is given (None: nowhere; tests).
        pusher_options: keyword arguments of every :class:`LokiPusher` (its bounds,
            flush interval, backoff), from wrk-monitor's ``loki`` settings.
        grace_s: how long a replaced pusher may finish its batch or flush.
    """

    def __init__(self, start: Observability | None = None, *, origin: str = "none",
                 settings: Observability | None = None,
                 storage: Path | None = None, pusher_options: dict[str, Any] | None = None,
                 grace_s: float = DEFAULT_GRACE_S,
                 make_reader: Callable[..., LokiReader] = LokiReader) -> None:
        self.value = start if start is not None else Observability()
        self.origin = origin
        if settings is None and origin == "settings":
            settings = self.value
        self.settings = settings
        self.persisted = origin == "file"
        self.storage = storage
        self.grace_s = grace_s
        self._pusher_options = dict(pusher_options or {})
        self._make_reader = make_reader
        self._current: _Pair | None = None
        # Bound: one per swap within grace_s; each leaves after at most grace_s.
        self._retiring: list[_Pair] = []
        self._retired = LokiPusherStatistics(0, 0, 0, 0, 0, 0)
        self._nursery: trio.Nursery | None = None
        self._lock = trio.Lock()
        # trust_env=False: an HTTP_PROXY must not capture the operator's Prometheus.
        self._prometheus_http = httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                                  timeout=10.0, verify=client_tls())
        #: Swaps applied (tests and the status line).
        self.swaps = 0

    @classmethod
    def from_storage(cls, storage: Path, *, settings_url: str | None,
                     settings_tenant: str | None, **kw: Any) -> ObservabilityHolder:
        """The holder a starting wrk-monitor uses: the file, else its settings (blocking read)."""
        own = None if settings_url is None else Observability(loki_url=settings_url,
                                                               loki_tenant=settings_tenant)
        saved = load_persisted(storage)
        if saved is not None:
            if settings_url is not None and saved.loki_url != settings_url:
                log.info("monitor.observability.from_file loki=%s (over the settings' %s)",
                         redact_url(saved.loki_url) or "off", redact_url(settings_url))
            return cls(saved, origin="file", settings=own, storage=storage, **kw)
        if own is None:
            return cls(origin="none", storage=storage, **kw)
        return cls(own, origin="settings", settings=own, storage=storage, **kw)

    # -- what the rest of wrk-monitor reads --------------------------------------------

    @property
    def pusher(self) -> LokiPusher | None:
        return None if self._current is None else self._current.pusher

    @property
    def reader(self) -> LokiReader | None:
        """The reader of the Loki in force (None: no Loki). Read it per use."""
        return None if self._current is None else self._current.reader

    @property
    def prometheus(self) -> PrometheusReader | None:
        """A reader of the Prometheus in force (None: none). Read it per use."""
        url = self.value.prometheus_url
        return None if url is None else PrometheusReader(url, self._prometheus_http)

    def offer(self, records: Iterable[LogRecord],
              cursors: Callable[[], list[str]] | None = None) -> None:
        """Queue ``records`` for the Loki in force, with their cursors (``cursors()``,
        asked only when there is a Loki); nothing without one. Never blocks."""
        current = self._current
        if current is None:
            return
        if cursors is None:
            current.pusher.offer_many(map(to_loki, records))
        else:
            current.pusher.offer_many(map(to_loki, records, cursors()))

    def statistics(self) -> LokiPusherStatistics:
        """Counters summed over every pusher so far; ``buffered`` the live ones' backlog."""
        live = [p.pusher.statistics() for p in
                [*self._retiring, *([self._current] if self._current else [])]]
        r = self._retired
        return LokiPusherStatistics(
            pushed=r.pushed + sum(s.pushed for s in live),
            failed=r.failed + sum(s.failed for s in live),
            dropped=r.dropped + sum(s.dropped for s in live),
            rejected=r.rejected + sum(s.rejected for s in live),
            retries=r.retries + sum(s.retries for s in live),
            buffered=sum(s.buffered for s in live))

    def state(self) -> ObservabilityState:
        """What is in force, URLs without credentials."""
        shown = self.value.redacted()
        return ObservabilityState(loki=self._current is not None, loki_url=shown.loki_url,
                                  loki_tenant=shown.loki_tenant,
                                  prometheus_url=shown.prometheus_url,
                                  origin=self.origin,  # type: ignore[arg-type]
                                  persisted=self.persisted)

    # -- running and swapping ----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run the pushers until cancelled; ``started`` once the start value is in force."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._install(self.value)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            pairs = [*self._retiring, *([self._current] if self._current else [])]
            with trio.CancelScope(shield=True):
                for pair in pairs:
                    await pair.pusher.aclose()
                    await pair.reader.aclose()
                await self._prometheus_http.aclose()

    async def set(self, value: Observability, *, origin: str = "app-node") -> ObservabilityState:
        """Put ``value`` in force (persisted first); answer what is in force then.

        Raises:
            RuntimeError: :meth:`run` is not running.
        """
        async with self._lock:
            persisted = False
            if self.storage is not None:
                try:
                    await trio.to_thread.run_sync(save_persisted, self.storage, value)
                    persisted = True
                except OSError as exc:
                    log.warning("monitor.observability.not_persisted path=%s error=%s (in force "
                                "until a restart)", self.storage / OBSERVABILITY_FILE, exc)
            return self._apply(value, origin, persisted, "set")

    async def clear(self) -> ObservabilityState:
        """Forget what app-node sent: wrk-monitor's own settings, else no Loki
        (the file deleted first); answer what is in force then.

        Raises:
            RuntimeError: :meth:`run` is not running.
        """
        async with self._lock:
            if self.storage is not None:
                try:
                    await trio.to_thread.run_sync(remove_persisted, self.storage)
                except OSError as exc:
                    log.warning("monitor.observability.not_removed path=%s error=%s (cleared "
                                "until a restart, which reads it back: delete it)",
                                self.storage / OBSERVABILITY_FILE, exc)
            if self.settings is None:
                return self._apply(Observability(), "none", False, "cleared")
            return self._apply(self.settings, "settings", False, "cleared")

    def _apply(self, value: Observability, origin: str, persisted: bool, how: str
               ) -> ObservabilityState:
        """Put ``value`` in force (swapping the pusher if Loki changed), logged if it changed."""
        if self._nursery is None:  # checked after the file: run() may have ended meanwhile
            raise RuntimeError("the observability holder is not running")
        old = self.value
        same_loki = (old.loki_url, old.loki_tenant) == (value.loki_url, value.loki_tenant)
        if old != value or self.origin != origin:
            shown, was = value.redacted(), old.redacted()
            log.info("monitor.observability.%s by=%s loki=%s tenant=%s prometheus=%s "
                     "(was loki=%s prometheus=%s from %s)", how,
                     "app-node" if how == "cleared" else origin,
                     shown.loki_url or "off", shown.loki_tenant or "-",
                     shown.prometheus_url or "off", was.loki_url or "off",
                     was.prometheus_url or "off", self.origin)
        self.value, self.origin, self.persisted = value, origin, persisted
        if not same_loki:
            self._swap(value)
        return self.state()

    def _open(self, value: Observability) -> _Pair | None:
        if value.loki_url is None:
            return None
        return _Pair(LokiPusher(value.loki_url, tenant=value.loki_tenant,
                                **self._pusher_options),
                     self._make_reader(value.loki_url, tenant=value.loki_tenant))

    def _install(self, value: Observability) -> None:
        assert self._nursery is not None
        pair = self._open(value)
        if pair is not None:
            self._nursery.start_soon(self._run_pusher, pair)
        self._current = pair

    def _swap(self, value: Observability) -> None:
        assert self._nursery is not None
        old = self._current
        self._install(value)
        self.swaps += 1
        if old is None:
            return
        if self._current is not None:
            for record in old.pusher.take_buffered():  # handed over, oldest first
                self._current.pusher.offer(record)
        self._retiring.append(old)
        self._nursery.start_soon(self._retire, old, self._current is None)

    @staticmethod
    async def _run_pusher(pair: _Pair) -> None:
        try:
            with pair.scope:
                await pair.pusher.run()
        finally:
            pair.ended.set()

    async def _retire(self, pair: _Pair, drain: bool) -> None:
        """Let ``pair`` finish its batch (or flush, on a clear) for ``grace_s``, then stop it."""
        pusher = pair.pusher
        with trio.move_on_after(self.grace_s):
            await (pusher.wait_drained() if drain else pusher.wait_idle())
        cut = pusher.in_flight + pusher.statistics().buffered
        pair.scope.cancel()
        await pair.ended.wait()
        with trio.CancelScope(shield=True):
            await pusher.aclose()
            await pair.reader.aclose()
        s, r = pusher.statistics(), self._retired
        self._retired = LokiPusherStatistics(
            pushed=r.pushed + s.pushed, failed=r.failed + s.failed,
            dropped=r.dropped + s.dropped + cut, rejected=r.rejected + s.rejected,
            retries=r.retries + s.retries, buffered=0)
        self._retiring.remove(pair)
        if cut:
            log.warning("monitor.observability.cut url=%s records=%d (the replaced Loki did "
                        "not take them within %.1f s)", pusher.safe_url, cut, self.grace_s)
        log.debug("monitor.observability.retired url=%s", pusher.safe_url)
