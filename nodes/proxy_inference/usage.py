"""Usage accounting: exact sums in memory, appended to the shared database in batches.

Theory of operation
-------------------
Every answered request reports what it used (the agent's last frame:
tokens, or audio milliseconds for speech). :class:`UsageBook` (I/O-free)
adds it to a bucket per (API key, served name, UTC day), counting one
request each, and keeps each key's latest use. :class:`UsageRecorder` (the
trio driver) takes the book's contents every ``flush_interval_s`` (or as soon
as ``flush_ops`` operations wait) and appends them with
``Database.append_many``: one entry per ``ops_per_entry`` operations, all in
one durable write. So 1,000 requests a second cost about five appends, and
the rows in the database are the sums of what the responses reported: an
integer add per request, taken out of the book only once it is durable.

Until an admin has admitted the proxy as a writer (``task
autobase-connect``), appends are refused (``NOT_A_WRITER``): the book keeps
its buckets (at most ``max_buckets``; usage for a new bucket beyond that is
dropped, counted and logged) and a warning says so once. On a clean stop the
recorder flushes once more; if it still cannot write, it saves the book to
``usage-pending.json`` in the proxy's folder, read back at the next start, so
counted usage survives a restart as well.

A failed append (``WriteRefused`` or the disk) puts its batch back into the
book: nothing of a refused batch was written (``Database.append_many``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from contracts.inference import Usage
from crdt import AddAudioUsage, AddTokenUsage, CrdtError, Database, MarkKeyUsed, Op
from p2p.files import write_atomically

__all__ = ["PENDING_FILE", "Bucket", "UsageBook", "UsageRecorder", "utc_day"]

log = logging.getLogger(__name__)

#: Flushes tried on a stop before what is left is saved to a file.
FINAL_FLUSHES = 3
#: Where usage that could not be written is kept across a restart.
PENDING_FILE = "usage-pending.json"


def utc_day(now_s: float) -> str:
    """``YYYY-MM-DD`` of a wall-clock time, in UTC (the last day formatted is kept:
    every request asks, and formatting cost as much as the rest of recording)."""
    day = int(now_s // 86400)
    if day != _last_day[0]:
        _last_day[:] = [day, time.strftime("%Y-%m-%d", time.gmtime(day * 86400))]
    return _last_day[1]


#: ``[days since the epoch, its YYYY-MM-DD]`` of the last :func:`utc_day`.
_last_day: list = [None, ""]


@dataclass(slots=True)
class Bucket:
    """Sums for one (key, model, day)."""

    prompt: int = 0
    completion: int = 0
    total: int = 0
    audio_ms: int = 0
    requests: int = 0

    def add(self, other: Bucket) -> None:
        self.prompt += other.prompt
        self.completion += other.completion
        self.total += other.total
        self.audio_ms += other.audio_ms
        self.requests += other.requests

    def op(self, key_id: str, model: str, day: str) -> Op:
        if self.audio_ms and not (self.prompt or self.completion or self.total):
            return AddAudioUsage(key_id, model, day, self.audio_ms, requests=self.requests)
        return AddTokenUsage(key_id, model, day, prompt=self.prompt,
                             completion=self.completion, total=self.total,
                             audio_ms=self.audio_ms, requests=self.requests)


BucketKey = tuple[str, str, str]


class UsageBook:
    """Usage counted and not yet written (I/O-free).

    Args:
        max_buckets: buckets kept at most; see :meth:`add`.
    """

    def __init__(self, *, max_buckets: int = 100_000) -> None:
        self.max_buckets = max_buckets
        self.buckets: dict[BucketKey, Bucket] = {}
        #: key id → latest use (ms since the epoch).
        self.last_used: dict[str, int] = {}
        #: Requests whose usage was dropped because the book was full.
        self.dropped = 0

    def __len__(self) -> int:
        """Operations a flush would write now."""
        return len(self.buckets) + len(self.last_used)

    def add(self, key_id: str, model: str, day: str, usage: Usage | None, at_ms: int) -> bool:
        """Count one request; False when it opened a bucket beyond ``max_buckets``
        (then nothing is counted and :attr:`dropped` grows)."""
        slot = (key_id, model, day)
        bucket = self.buckets.get(slot)
        if bucket is None:
            if len(self.buckets) >= self.max_buckets:
                self.dropped += 1
                return False
            bucket = self.buckets[slot] = Bucket()
        if usage is not None:
            bucket.prompt += usage.prompt_tokens
            bucket.completion += usage.completion_tokens
            bucket.total += usage.total_tokens
            bucket.audio_ms += usage.audio_ms
        bucket.requests += 1
        if at_ms > self.last_used.get(key_id, -1):
            self.last_used[key_id] = at_ms
        return True

    def take(self) -> UsageBook:
        """Everything counted so far, as a book of its own; this one is left empty."""
        taken = UsageBook(max_buckets=self.max_buckets)
        taken.buckets, self.buckets = self.buckets, {}
        taken.last_used, self.last_used = self.last_used, {}
        return taken

    def put_back(self, other: UsageBook) -> None:
        """Merge a taken book back (its write failed); nothing is lost or counted twice.

        Merging may exceed ``max_buckets``: these were counted within the
        bound, and dropping them now would lose usage already promised.
        """
        for slot, bucket in other.buckets.items():
            mine = self.buckets.get(slot)
            if mine is None:
                self.buckets[slot] = Bucket(bucket.prompt, bucket.completion, bucket.total,
                                            bucket.audio_ms, bucket.requests)
            else:
                mine.add(bucket)
        for key_id, at_ms in other.last_used.items():
            if at_ms > self.last_used.get(key_id, -1):
                self.last_used[key_id] = at_ms

    def entries(self, ops_per_entry: int) -> list[list[Op]]:
        """The book as entries for ``append_many``: at most ``ops_per_entry`` ops each."""
        ops: list[Op] = [bucket.op(*slot) for slot, bucket in self.buckets.items()]
        ops.extend(MarkKeyUsed(key_id, at_ms) for key_id, at_ms in self.last_used.items())
        return [ops[i:i + ops_per_entry] for i in range(0, len(ops), ops_per_entry)]

    def to_json(self) -> dict:
        return {"buckets": [[*slot, b.prompt, b.completion, b.total, b.audio_ms, b.requests]
                            for slot, b in self.buckets.items()],
                "last_used": self.last_used}

    @classmethod
    def from_json(cls, data: dict, *, max_buckets: int = 100_000) -> UsageBook:
        """A book saved by :meth:`to_json`.

        Raises:
            ValueError: the document is not one (the caller keeps the file aside).
        """
        book = cls(max_buckets=max_buckets)
        try:
            for key_id, model, day, *counts in data["buckets"]:
                values = [int(c) for c in counts]
                if len(values) != 5 or min(values) < 0:
                    raise ValueError("bad counts")
                book.buckets[(str(key_id), str(model), str(day))] = Bucket(*values)
            book.last_used = {str(k): int(v) for k, v in data["last_used"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a saved usage book: {exc!r}") from None
        return book


class UsageRecorder:
    """Writes a :class:`UsageBook` to the shared database in batches (see the module doc).

    Args:
        db: the proxy's replica.
        storage: the proxy's folder (for :data:`PENDING_FILE`); None keeps nothing.
        clock: wall-clock seconds, for the UTC day and the last-used time.
    """

    def __init__(self, db: Database, *, storage: Path | None = None,
                 flush_interval_s: float = 0.2, flush_ops: int = 256,
                 ops_per_entry: int = 256, max_buckets: int = 100_000,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.book = UsageBook(max_buckets=max_buckets)
        self.flush_interval_s = flush_interval_s
        self.flush_ops = flush_ops
        self.ops_per_entry = ops_per_entry
        self._clock = clock
        self._pending_path = storage / PENDING_FILE if storage is not None else None
        self._wake = trio.Event()
        self._warned_not_writer = False
        self._saved_file_loaded = False
        #: A flush is writing now.
        self.flushing = False
        #: Counters for the metrics.
        self.flushes = 0
        self.ops_written = 0
        self.write_failures = 0

    def record(self, key_id: str, model: str, usage: Usage | None) -> None:
        """Count one answered request (synchronous: the request path never waits)."""
        now = self._clock()
        counted = self.book.add(key_id, model, utc_day(now), usage, int(now * 1000))
        if not counted and (self.book.dropped in (1, 10, 100) or self.book.dropped % 1000 == 0):
                log.error("proxy.usage_dropped requests=%d buckets=%d reason=book full while "
                          "not admitted as a writer", self.book.dropped, len(self.book.buckets))
        if len(self.book) >= self.flush_ops:
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush until cancelled; then flush once more (or save the book)."""
        await self._load_pending()
        task_status.started()
        try:
            while True:
                with trio.move_on_after(self.flush_interval_s):
                    await self._wake.wait()
                self._wake = trio.Event()
                if not self.db.is_writer:
                    self._warn_not_writer()
                    continue
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                await self._final_flush()

    async def flush(self) -> int:
        """Append what the book holds now; returns the operations written (0 on failure)."""
        if not len(self.book):
            return 0
        self.flushing = True
        try:
            return await self._flush()
        finally:
            self.flushing = False

    @property
    def settled(self) -> bool:
        """Nothing counted is waiting or being written (what a test waits for)."""
        return not len(self.book) and not self.flushing

    async def _flush(self) -> int:
        taken = self.book.take()
        entries = taken.entries(self.ops_per_entry)
        try:
            await self.db.append_many(entries)
        except (CrdtError, OSError) as exc:  # refused, or the disk; nothing was written
            self.book.put_back(taken)
            self.write_failures += 1
            code = getattr(exc, "code", "ERROR")
            if code == "NOT_A_WRITER":
                self._warn_not_writer()
            else:
                log.warning("proxy.usage_write_failed code=%s reason=%s ops=%d", code, exc,
                            sum(map(len, entries)))
            return 0
        except BaseException:
            # Cancelled: append_many's only checkpoints come before its worker thread
            # starts (a running thread always finishes and returns), so nothing was written.
            self.book.put_back(taken)
            raise
        written = sum(map(len, entries))
        if self._saved_file_loaded and self._pending_path is not None:
            # Written now: the saved copy must go, even if we are being cancelled
            # (left behind, it would be loaded and counted again at the next start).
            self._saved_file_loaded = False
            path = self._pending_path
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
        self.flushes += 1
        self.ops_written += written
        if self._warned_not_writer:
            log.info("proxy.usage_admitted db=%s ops=%d", self.db.bootstrap.hex()[:16], written)
            self._warned_not_writer = False
        return written

    def _warn_not_writer(self) -> None:
        if not self._warned_not_writer and len(self.book):
            self._warned_not_writer = True
            log.warning("proxy.usage_held reason=not admitted as a writer of the shared "
                        "database yet (run task autobase-connect) buckets=%d",
                        len(self.book.buckets))

    async def _final_flush(self) -> None:
        """Flush until the book is empty (requests finishing meanwhile count too), or
        save it; bounded in tries and time."""
        if self.db.is_writer:
            with trio.move_on_after(10):
                for _ in range(FINAL_FLUSHES):
                    if not len(self.book) or not await self.flush():
                        break
        if len(self.book):
            await self._save_pending()

    async def _save_pending(self) -> None:
        path = self._pending_path
        if path is None:
            log.error("proxy.usage_lost buckets=%d reason=not a writer and no storage",
                      len(self.book.buckets))
            return
        text = json.dumps(self.book.to_json())

        await trio.to_thread.run_sync(write_atomically, path, text.encode())
        log.warning("proxy.usage_saved path=%s buckets=%d reason=not written to the database "
                    "yet; it will be at the next start", path, len(self.book.buckets))

    async def _load_pending(self) -> None:
        path = self._pending_path
        if path is None:
            return
        try:
            text = await trio.to_thread.run_sync(path.read_text)
        except FileNotFoundError:
            return
        try:
            saved = UsageBook.from_json(json.loads(text), max_buckets=self.book.max_buckets)
        except ValueError as exc:
            aside = path.with_name(path.name + ".bad")
            await trio.to_thread.run_sync(os.replace, path, aside)
            log.error("proxy.usage_file_unreadable path=%s moved_to=%s reason=%s", path,
                      aside, exc)
            return
        self.book.put_back(saved)
        # Kept until a flush has written it (a crash before that must not lose it).
        self._saved_file_loaded = True
        log.info("proxy.usage_loaded path=%s buckets=%d", path, len(saved.buckets))
