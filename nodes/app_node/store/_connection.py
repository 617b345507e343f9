"""The one SQLite connection an app-node store and all its repositories share."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from nodes.kit.sqlite import immediate

from ..errors import StoreError
from ._read_cache import ReadCache, check_may_block

__all__ = ["Connection"]


class Connection:
    """An SQLite connection with one lock, and the transaction rules of the store.

    Every repository reads and writes through the same instance, so one lock
    serialises the threads on the single connection and a change that spans
    aggregates (the first admin and their team, an invitation and the
    membership it grants) is still one transaction.
    """

    def __init__(self, sqlite: sqlite3.Connection, path: Path | None) -> None:
        #: The underlying connection (tests swap it to make a statement fail).
        self.sqlite = sqlite
        self.path = path
        self._lock = threading.RLock()
        #: Bumped as each change begins and as it ends: the :class:`ReadCache`'s answers
        #: of an older generation are not served.
        self.generation = 0
        #: Changes under way in the thread holding the lock (nested writes count): reads
        #: inside one may see what it has not committed, so their answers are not kept.
        self.writing = 0
        #: The hot reads' answers while the store is unchanged (``_read_cache.py``).
        self.cache = ReadCache(self)

    def close(self) -> None:
        with self._lock:
            self.sqlite.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One atomic change: everything inside commits together or not at all.

        Raises:
            NotCached: inside ``cache_only`` (nothing is written).
        """
        check_may_block()
        with self._lock:
            self.generation += 1  # before any statement: kept answers are stale from here
            self.writing += 1
            try:
                with immediate(self.sqlite):
                    yield self.sqlite
            except sqlite3.Error as exc:
                raise StoreError(f"writing {self.path or 'the store'} failed ({exc}); nothing "
                                 "was changed; check the disk and the file's permissions") from exc
            finally:
                self.writing -= 1
                self.generation += 1

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """Reads that see one state of the file; a row that does not decode is a StoreError.

        Raises:
            NotCached: inside ``cache_only`` (SQLite is not touched).
        """
        check_may_block()
        with self._lock:
            try:
                yield self.sqlite
            except (ValidationError, ValueError) as exc:
                raise StoreError(f"a row in {self.path} cannot be read ({exc}); "
                                 "restore a backup of the store") from exc
            except sqlite3.Error as exc:
                raise StoreError(f"reading {self.path or 'the store'} failed ({exc}); "
                                 "check the disk and the file's permissions") from exc

    def one(self, sql: str, args: tuple) -> tuple | None:
        """The first row of ``sql`` (inside :meth:`read` or :meth:`write`)."""
        return self.sqlite.execute(sql, args).fetchone()

    def execute(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        """Run ``sql`` (inside :meth:`read` or :meth:`write`)."""
        return self.sqlite.execute(sql, args)
