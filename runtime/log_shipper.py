"""The sender side of ``cosmicac-monitor/1``: what every daemon and agent runs.

Theory of operation
-------------------
:meth:`LogShipper.offer` is synchronous and never blocks: it appends to a
bounded deque and, when the deque is full, the oldest record goes and
``dropped`` counts it. So a sender never waits for wrk-monitor, whether it is
slow, down or unknown; it loses log lines (counted), never its own work.
``offer`` may be called from any thread (a ``logging`` handler runs in the
thread that logs, e.g. a ``trio.to_thread`` worker): it only touches the
deque, whose ``append``/``popleft`` are atomic in CPython, and the counter
(an increment that two threads may race on: ``dropped`` is approximate under
that, never low by more than the racing threads).

The shipping task sleeps while the deque is empty and costs nothing then (a
proxy that logs nothing per request pays no timer): the first ``offer`` after
it went idle wakes it, directly from the trio thread or through the run's
``TrioToken`` from any other, once per idle spell (a flag read per offer, no
call). Awake, it sends as soon as a full batch waits and otherwise after
``flush_interval_s`` (20 ms by default, well inside the 100 ms delivery
target) to gather a batch. One push is in flight
at a time (records stay in order); a batch not acknowledged (the connection
went, the call timed out, the monitor was busy) goes back to the front of the
deque, still bounded, and is sent again on the next connection; a refused batch
(``BAD_BATCH``, ``FORBIDDEN``) is dropped and counted, so a bug or a missing
permission never wedges the queue.

:meth:`LogShipper.run` keeps a connection to wrk-monitor with
``p2p.swarm.stay_connected`` (its backoff while wrk-monitor is down), as
``nodes/proxy_inference/jobs.py`` does to wrk-ork; :meth:`LogShipper.ship`
is the part over one RPC client (what the tests drive over in-memory muxes).

:class:`ShipperHandler` is the ``logging.Handler`` that turns a daemon's log
records into System records (``job_id`` and ``replica`` from the log call's
``extra`` when given).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence

import trio

from contracts.monitor import (
    MAX_BATCH_RECORDS,
    PROTOCOL,
    PUSH,
    SYSTEM,
    LogRecord,
    PushBatch,
    encode_batch,
    make_record,
    split_batches,
)
from p2p.rpc import Method, RpcClient, RpcError, keep_client_channel

__all__ = ["CHANNEL_ID", "LogShipper", "ShipperHandler"]

log = logging.getLogger(__name__)

#: The shipper's ``cosmicac-monitor/1`` channel id: a daemon that also reads
#: from wrk-monitor (app-node) or reports metrics to it (proxy-inference) opens
#: the same protocol on the same connection, and a mux keeps one channel per
#: (protocol, id).
CHANNEL_ID = b"logs"

#: Records held while wrk-monitor is slow or down: ~100 s of a busy daemon's
#: logs, a few tens of MB at most.
DEFAULT_MAX_RECORDS = 100_000
#: Records per push (500 a message: ~100 pushes a second at 50,000 records/s).
DEFAULT_BATCH_RECORDS = 500
#: Codes after which the same batch would be refused again: drop it.
_REFUSED = frozenset({"BAD_BATCH", "FORBIDDEN", "INVALID_PARAMS"})


class LogShipper:
    """A bounded queue of records and the task that pushes them to wrk-monitor.

    Args:
        max_records: held at most; beyond it the oldest are dropped and counted.
        batch_records: records per push (at most ``MAX_BATCH_RECORDS``).
        flush_interval_s: how often a partial batch is sent.
        push_timeout_s: a push not answered by then is retried on a new channel.
        retry_s: the wait before a channel is opened again on the same connection.
        method: the push method, params ``PushBatch``, result ``PushResult``:
            wrk-monitor's ``logs.push`` (default), or ``agent.logs`` for an agent
            that ships to its worker (``ship`` over the agent's client; ``run``
            dials wrk-monitor and only makes sense with ``logs.push``).
    """

    def __init__(self, *, max_records: int = DEFAULT_MAX_RECORDS,
                 batch_records: int = DEFAULT_BATCH_RECORDS,
                 flush_interval_s: float = 0.02, push_timeout_s: float = 10.0,
                 retry_s: float = 1.0, method: Method = PUSH) -> None:
        if max_records < 1 or not 1 <= batch_records <= MAX_BATCH_RECORDS:
            raise ValueError("max_records must be positive and batch_records 1-1000")
        self.max_records = max_records
        self.batch_records = batch_records
        self.flush_interval_s = flush_interval_s
        self.push_timeout_s = push_timeout_s
        self.retry_s = retry_s
        self.method = method
        self._queue: deque[LogRecord] = deque(maxlen=max_records)
        #: Records dropped because the queue was full (oldest first).
        self.dropped = 0
        #: Records refused by wrk-monitor (``BAD_BATCH``, ``FORBIDDEN``) and dropped.
        self.refused = 0
        #: Records acknowledged by wrk-monitor.
        self.sent = 0
        #: A push is acknowledged on the current connection (for health).
        self.connected = False
        #: Set while the shipping task waits for a first record (see the module doc).
        self._idle = False
        self._wakeup = trio.Event()
        self._wake_sent = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._trio_thread = 0

    @property
    def pending(self) -> int:
        """Records waiting to be sent."""
        return len(self._queue)

    def offer(self, record: LogRecord) -> None:
        """Queue ``record``; never blocks, never raises. Thread-safe (see module doc)."""
        queue = self._queue
        if len(queue) >= self.max_records:
            self.dropped += 1  # the deque's maxlen drops the oldest on append
        queue.append(record)
        if self._idle:
            self._wake()

    def offer_many(self, records: Iterable[LogRecord]) -> None:
        """Queue ``records`` in order, as :meth:`offer` each would: never blocks,
        never raises; beyond the bound the oldest (queued ones first) are dropped
        and counted. Thread-safe as :meth:`offer` is."""
        records = records if isinstance(records, (list, tuple)) else list(records)
        queue = self._queue
        over = len(queue) + len(records) - self.max_records
        if over > 0:
            self.dropped += over
        queue.extend(records)  # the deque's maxlen drops the oldest
        if self._idle and records:
            self._wake()

    def _wake(self) -> None:
        """Wake the idle shipping task, once per idle spell, from any thread."""
        if self._wake_sent:
            return
        self._wake_sent = True
        if threading.get_ident() == self._trio_thread:
            self._wakeup.set()
            return
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._wakeup.set)
            except trio.RunFinishedError:  # the shipper's run has ended: nobody to wake
                pass

    async def _wait_for_records(self) -> None:
        """Return once the deque holds a record; no timer runs meanwhile."""
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        self._wakeup = trio.Event()
        self._wake_sent = False
        # The flag goes up before the deque is looked at: an offer that comes
        # after this look sees it and wakes us; one before it is seen here.
        self._idle = True
        try:
            if not self._queue:
                await self._wakeup.wait()
        finally:
            self._idle = False

    def _take(self) -> list[LogRecord]:
        queue = self._queue
        batch: list[LogRecord] = []
        for _ in range(min(self.batch_records, len(queue))):
            try:
                batch.append(queue.popleft())
            except IndexError:  # another thread's append raced a drop
                break
        return batch

    def _put_back(self, batch: list[LogRecord]) -> None:
        """Return an unacknowledged ``batch`` to the front, dropping the oldest beyond the bound."""
        room = self.max_records - len(self._queue)
        if len(batch) > room:
            excess = len(batch) - max(room, 0)
            self.dropped += excess
            batch = batch[excess:]
        self._queue.extendleft(reversed(batch))

    async def ship(self, client: RpcClient) -> None:
        """Push batches over ``client`` until its channel fails; what was not
        acknowledged stays queued. Returns (never raises an ``RpcError``)."""
        try:
            while True:
                if not self._queue:
                    await self._wait_for_records()
                if len(self._queue) < self.batch_records:
                    await trio.sleep(self.flush_interval_s)  # let a batch gather
                batch = self._take()
                done = 0
                try:
                    for chunk in split_batches(batch):
                        try:
                            params = PushBatch(records=encode_batch(chunk))
                        except (ValueError, TypeError) as exc:
                            # A record not made by make_record (it makes them encodable):
                            # that chunk is lost and counted, never the shipper.
                            self.refused += len(chunk)
                            done += len(chunk)
                            log.warning("shipper.unencodable records=%d reason=%s",
                                        len(chunk), exc)
                            continue
                        try:
                            result = await client.call(self.method, params,
                                                       timeout_s=self.push_timeout_s)
                        except RpcError as exc:
                            if exc.code not in _REFUSED:
                                log.info("shipper.push_failed code=%s reason=%s",
                                         exc.code, exc)
                                return
                            self.refused += len(chunk)
                            log.warning("shipper.refused records=%d code=%s reason=%s",
                                        len(chunk), exc.code, exc)
                        else:
                            self.sent += result.accepted
                            self.connected = True
                        done += len(chunk)
                finally:
                    # Failed, or cancelled mid-push (an agent's session ends on a
                    # missed heartbeat): what was not acknowledged goes back to be
                    # sent on the next channel. The receiver may see it twice, as
                    # after a timeout; it never silently loses it.
                    if done < len(batch):
                        self._put_back(batch[done:])
        finally:
            self.connected = False

    async def run(self, swarm: object, monitor: bytes, *, addresses: Sequence = (),
                  backoff: object | None = None,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a connection to wrk-monitor (key ``monitor``; ``addresses`` tried before
        the DHT) and ship over it until cancelled; ``backoff``: a ``UpkeepPolicy``."""
        from p2p.swarm import stay_connected  # the swarm only where it runs

        extra = {} if backoff is None else {"backoff": backoff}
        await stay_connected(swarm, monitor, addresses=tuple(addresses) or None,
                             on_connection=self._on_connection, task_status=task_status,
                             **extra)

    async def _on_connection(self, connection) -> None:
        await keep_client_channel(connection, PROTOCOL, self.ship, channel_id=CHANNEL_ID,
                                  name="log_shipper", retry_s=self.retry_s)


class ShipperHandler(logging.Handler):
    """``logging`` records as System :class:`LogRecord` s offered to ``shipper``.

    ``job_id`` and ``replica`` come from the log call's ``extra`` (``log.info(...,
    extra={"job_id": "j-1", "replica": 0})``); records of ``runtime.log_shipper``
    itself are skipped (a failing push must not feed the queue it failed to send).
    """

    def __init__(self, shipper: LogShipper, *, service: str, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.shipper = shipper
        self.service = service

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == __name__:
            return
        try:
            job_id = getattr(record, "job_id", None)
            replica = getattr(record, "replica", None)
            text = self.format(record)
            self.shipper.offer(make_record(
                text, service=self.service, source=SYSTEM, level=record.levelno,
                job_id=job_id if isinstance(job_id, str) else None,
                replica=replica if isinstance(replica, int) and 0 <= replica < 1 << 16 else None,
                time_ns=int(record.created * 1e9)))
        except Exception:
            self.handleError(record)
