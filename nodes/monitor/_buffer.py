"""The sans-IO core of wrk-monitor: a bounded ring of recent records and followers.

No trio, no clock: :meth:`LogBuffer.append` is called with each pushed batch and
does everything at once (number, keep, hand to followers, evict), so ingestion
costs the same whether zero or fifty followers are slow. Each record gets a
sequence number one above the previous record's (from 1), so a follower can
say where it is and a test can check order.

A follower (:class:`Follower`) gets the matching records still in the ring when
it starts (its snapshot: references, not copies), then live ones through a
queue of at most ``queue_records``. One that falls further behind is cut off:
``lagged`` is set, it is removed from the buffer (it gets nothing more), and it
may drain what it already holds; the driver then ends its stream with
``LAGGED``. A slow follower never slows ingestion or the other followers.

The driver learns that a follower has something by its ``notify`` callback,
called after records were queued to it (or it was cut off), once per append.

Each record of a job also gets a number in its job (from 1, no gaps), so a
reader of one job (the logs tab, ``jobs logs -f``) can resume right after the
last record it has: nothing missing, nothing twice. The numbering is named by
a *stream* id, ``<epoch>.<generation>``: the buffer's epoch (a restarted
wrk-monitor starts a new one, and an empty ring) and the global sequence number
at which the job's numbering began. A job's counter is kept for at most
:data:`MAX_JOB_COUNTERS` jobs (the least recently logging forgotten first); a
job whose counter was forgotten gets a new stream, so a reader resuming from
the old one starts again from the ring's first record rather than skip any.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from contracts.monitor import LogRecord, record_size

__all__ = ["BufferStats", "Follower", "LogBuffer"]

#: Records kept by default: a few seconds at the target rate, enough for a
#: follower that starts just after a job failed to see why.
DEFAULT_MAX_RECORDS = 200_000
#: Estimated bytes kept by default (``record_size``).
DEFAULT_MAX_BYTES = 64 << 20
#: Records queued for one follower beyond its snapshot before it is cut off
#: (about a second at the target rate).
DEFAULT_QUEUE_RECORDS = 50_000
#: Jobs whose numbering is kept (about 100 bytes each).
MAX_JOB_COUNTERS = 100_000

#: (global sequence, record, its number in its job; 0 for a record of no job).
Numbered = tuple[int, LogRecord, int]


def _new_epoch() -> str:
    """Now in milliseconds, in hex; later than any epoch made before in this process."""
    global _last_epoch
    _last_epoch = max(time.time_ns() // 1_000_000, _last_epoch + 1)
    return f"{_last_epoch:011x}"


_last_epoch = 0


@dataclass
class BufferStats:
    """Counters since start (what ``/metrics`` will export)."""

    #: Records appended.
    received: int = 0
    #: Records evicted from the ring by its bounds (oldest first).
    evicted: int = 0
    #: Followers cut off for falling behind.
    followers_lagged: int = 0
    #: Records in the ring now and their estimated bytes.
    records: int = 0
    bytes: int = 0


class Follower:
    """One follower's filter, snapshot and queue; made by :meth:`LogBuffer.follow`."""

    __slots__ = ("_queue", "_snapshot", "job_id", "lagged", "limit", "notify", "since_ns",
                 "source")

    def __init__(self, *, job_id: str | None, source: str | None, since_ns: int | None,
                 limit: int, notify: Callable[[], object] | None) -> None:
        self.job_id, self.source, self.since_ns = job_id, source, since_ns
        self.limit = limit
        self.notify = notify
        #: Cut off: nothing more will be queued; drain, then end with LAGGED.
        self.lagged = False
        self._snapshot: deque[Numbered] = deque()
        self._queue: deque[Numbered] = deque()

    def wants(self, record: LogRecord) -> bool:
        """Whether ``record`` passes this follower's filter."""
        return ((self.job_id is None or record.job_id == self.job_id)
                and (self.source is None or record.source == self.source)
                and (self.since_ns is None or record.time_ns >= self.since_ns))

    def first_pending(self) -> Numbered | None:
        """The oldest item waiting to be taken (snapshot first), or None."""
        for source in (self._snapshot, self._queue):
            if source:
                return source[0]
        return None

    @property
    def pending(self) -> int:
        """Records waiting to be taken (snapshot and live)."""
        return len(self._snapshot) + len(self._queue)

    def take(self, max_records: int) -> list[tuple[int, LogRecord]]:
        """Up to ``max_records`` (sequence, record) pairs, snapshot first, oldest first."""
        return [(seq, record) for seq, record, _ in self.take_numbered(max_records)]

    def take_numbered(self, max_records: int) -> list[Numbered]:
        """As :meth:`take`, with each record's number in its job."""
        out: list[Numbered] = []
        for source in (self._snapshot, self._queue):
            while source and len(out) < max_records:
                out.append(source.popleft())
        return out

    def _offer(self, items: list[Numbered]) -> bool:
        """Queue ``items``; False (and cut off) when that would exceed the limit."""
        if len(self._queue) + len(items) > self.limit:
            self.lagged = True
            return False
        self._queue.extend(items)
        return True


class LogBuffer:
    """A ring of recent records bounded by count and bytes, and its followers.

    Args:
        max_records / max_bytes: the ring's bounds (the oldest records go first).
        queue_records: live records queued per follower before it is cut off.
    """

    def __init__(self, *, max_records: int = DEFAULT_MAX_RECORDS,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 queue_records: int = DEFAULT_QUEUE_RECORDS,
                 max_job_counters: int = MAX_JOB_COUNTERS, epoch: str | None = None) -> None:
        if max_records < 1 or max_bytes < 1 or queue_records < 1 or max_job_counters < 1:
            raise ValueError("bounds must be positive")
        self.max_records, self.max_bytes = max_records, max_bytes
        self.queue_records = queue_records
        self.max_job_counters = max_job_counters
        #: Names this buffer's numbering (a restarted wrk-monitor has another): its
        #: start in milliseconds, in hex, so later epochs sort after earlier ones
        #: (:func:`~contracts.monitor.stream_order`). The one read of a clock here.
        self.epoch = epoch or _new_epoch()
        #: The records of the last append, numbered (what :meth:`last_cursors` names).
        self._last: list[Numbered] = []
        self.stats = BufferStats()
        #: The last sequence number given (0: none yet).
        self.seq = 0
        #: (global sequence, record, size, number in its job).
        self._ring: deque[tuple[int, LogRecord, int, int]] = deque()
        self._followers: set[Follower] = set()
        #: Each job's [generation, last number, cursor prefix], least recently logging
        #: first.
        self._jobs: OrderedDict[str, list] = OrderedDict()

    @property
    def followers(self) -> int:
        """Followers attached now (not cut off, not closed)."""
        return len(self._followers)

    def records(self) -> list[tuple[int, LogRecord]]:
        """What the ring holds, oldest first (for tests and a history read)."""
        return [(seq, rec) for seq, rec, _, _ in self._ring]

    def last_cursors(self) -> list[str]:
        """The cursor of each record of the last append (``""`` for a record of no job),
        in order: what Loki keeps beside each line, so its history is numbered too."""
        jobs = self._jobs
        out = []
        for _, record, job_seq in self._last:
            counter = jobs.get(record.job_id) if job_seq else None
            out.append("" if counter is None else counter[2] + str(job_seq))
        return out

    def last_number(self, job_id: str) -> int:
        """The number of ``job_id``'s newest record in its current stream (0: none)."""
        counter = self._jobs.get(job_id)
        return 0 if counter is None else counter[1]

    def job_stream(self, job_id: str) -> str | None:
        """The stream id of ``job_id``'s numbering, or None before its first record
        (or once its counter was forgotten)."""
        counter = self._jobs.get(job_id)
        return None if counter is None else f"{self.epoch}.{counter[0]}"

    def newest(self, wants: Callable[[LogRecord], bool],
               limit: int) -> list[tuple[int, LogRecord]]:
        """The newest ``limit`` records ``wants`` accepts, oldest first: scanned from
        the newest end, so a read of a busy job's tail stops early."""
        out: list[tuple[int, LogRecord]] = []
        for seq, rec, _, _ in reversed(self._ring):
            if wants(rec):
                out.append((seq, rec))
                if len(out) >= limit:
                    break
        out.reverse()
        return out

    @property
    def first(self) -> LogRecord | None:
        """The oldest record held (by arrival), or None when empty."""
        return self._ring[0][1] if self._ring else None

    def append(self, records: list[LogRecord]) -> int:
        """Number ``records``, keep them, hand them to followers; the last sequence number."""
        if not records:
            return self.seq
        stats = self.stats
        ring = self._ring
        jobs = self._jobs
        seq = self.seq
        numbered: list[Numbered] = []
        added = 0
        for record in records:
            seq += 1
            size = record_size(record)
            job_seq = 0
            job_id = record.job_id
            if job_id is not None:
                counter = jobs.get(job_id)
                if counter is None:
                    # [generation, last number, the cursors' "<stream>:" prefix]
                    counter = jobs[job_id] = [seq, 0, f"{self.epoch}.{seq}:"]
                    if len(jobs) > self.max_job_counters:
                        jobs.popitem(last=False)
                else:
                    jobs.move_to_end(job_id)
                counter[1] += 1
                job_seq = counter[1]
            ring.append((seq, record, size, job_seq))
            numbered.append((seq, record, job_seq))
            added += size
        self.seq = seq
        self._last = numbered
        stats.received += len(records)
        stats.records += len(records)
        stats.bytes += added
        while stats.records > self.max_records or (stats.bytes > self.max_bytes
                                                    and stats.records > 1):
            _, _, size, _ = ring.popleft()
            stats.records -= 1
            stats.bytes -= size
            stats.evicted += 1
        for follower in list(self._followers):
            wanted = [item for item in numbered if follower.wants(item[1])]
            if not wanted:
                continue
            if not follower._offer(wanted):
                self._followers.discard(follower)
                stats.followers_lagged += 1
            if follower.notify is not None:
                follower.notify()
        return seq

    def follow(self, *, job_id: str | None = None, source: str | None = None,
               since_ns: int | None = None, snapshot: bool = True,
               notify: Callable[[], object] | None = None,
               queue_records: int | None = None, numbered: bool = False,
               after: tuple[str, int] | None = None) -> Follower:
        """A new follower: the matching records in the ring now (when ``snapshot``),
        then every matching record appended after this call.

        ``numbered`` (with a ``job_id``): the snapshot holds only records of the
        job's current numbering (:meth:`job_stream`), so their numbers never
        repeat; ``after`` (that stream's id and a number) leaves out those up to it,
        when that is still the job's stream.
        """
        follower = Follower(job_id=job_id, source=source, since_ns=since_ns,
                            limit=queue_records or self.queue_records, notify=notify)
        if snapshot:
            wants = follower.wants
            skip_to = first_seq = 0
            if numbered:
                if job_id is None:
                    raise ValueError("numbered records are a job's: give its job_id")
                counter = self._jobs.get(job_id)
                # No counter: what the ring holds of the job was numbered by a
                # forgotten one; its next record begins a new stream.
                first_seq = counter[0] if counter is not None else self.seq + 1
                if after is not None and after[0] == self.job_stream(job_id):
                    skip_to = after[1]
            if numbered:
                follower._snapshot.extend((seq, rec, job_seq)
                                          for seq, rec, _, job_seq in self._ring
                                          if seq >= first_seq and job_seq > skip_to
                                          and wants(rec))
            else:
                follower._snapshot.extend((seq, rec, job_seq)
                                          for seq, rec, _, job_seq in self._ring
                                          if wants(rec))
        self._followers.add(follower)
        return follower

    def unfollow(self, follower: Follower) -> None:
        """Detach ``follower`` (its stream ended); idempotent."""
        self._followers.discard(follower)
