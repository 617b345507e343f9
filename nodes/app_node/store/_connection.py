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

    def close(self) -> None:
        with self._lock:
            self.sqlite.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One atomic change: everything inside commits together or not at all."""
        with self._lock:
            try:
                with immediate(self.sqlite):
                    yield self.sqlite
            except sqlite3.Error as exc:
                raise StoreError(f"writing {self.path or 'the store'} failed ({exc}); nothing "
                                 "was changed; check the disk and the file's permissions") from exc

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """Reads that see one state of the file; a row that does not decode is a StoreError."""
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
