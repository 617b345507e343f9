"""Where a replica keeps what: the files under ``<storage>/db`` and the database key.

::

    <storage>/identity             the replica's key pair (p2p.keys; also its swarm key)
    <storage>/db/database.json     {"format": 1, "bootstrap": "<hex key>"}
    <storage>/db/logs/<key>.log    one WriterLog per writer
    <storage>/db/view.sqlite       the view (a cache, rebuilt from the logs)
    <storage>/db/gate.snapshot     the gate saved on close (a cache, for fast restarts)
    <storage>/db/status.json       written by a running daemon: pid, address, peers
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from p2p.files import private_folder, write_atomically
from p2p.keys import format_key

from ._errors import CrdtError, DatabaseMismatch

__all__ = ["FORMAT", "Layout"]

FORMAT = 1


@dataclass(frozen=True, slots=True)
class Layout:
    """The paths of one replica's files."""

    root: Path  # <storage>/db

    @classmethod
    def of(cls, storage: str | os.PathLike[str]) -> Layout:
        return cls(Path(storage) / "db")

    @property
    def storage(self) -> Path:
        return self.root.parent

    @property
    def meta(self) -> Path:
        return self.root / "database.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def view(self) -> Path:
        return self.root / "view.sqlite"

    @property
    def snapshot(self) -> Path:
        return self.root / "gate.snapshot"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    def log(self, writer: bytes) -> Path:
        return self.logs / f"{writer.hex()}.log"

    def log_files(self) -> Iterator[tuple[Path, bytes | None]]:
        """Every ``*.log`` file, with its writer key (None if the name is not one)."""
        for path in sorted(self.logs.glob("*.log")):
            try:
                key: bytes | None = bytes.fromhex(path.stem)
            except ValueError:
                key = None
            yield path, key if key is not None and len(key) == 32 else None

    def read_bootstrap(self) -> bytes:
        """The database key.

        Raises:
            CrdtError: ``NO_DATABASE`` or ``BAD_METADATA``.
        """
        try:
            meta = json.loads(self.meta.read_text())
            stored = bytes.fromhex(meta["bootstrap"])
            if meta.get("format") != FORMAT or len(stored) != 32:
                raise ValueError(f"unknown format {meta.get('format')!r}")
        except FileNotFoundError:
            raise CrdtError(f"{self.storage} holds no database ({self.meta} is missing)",
                            code="NO_DATABASE") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CrdtError(f"{self.meta} is unreadable ({exc}); restore it or remove the "
                            "folder and let replication fetch the database again",
                            code="BAD_METADATA") from None
        return stored

    def create_or_check(self, bootstrap: bytes, *, explicit: bool) -> bytes:
        """The folder's database key, written on first use (atomically).

        Raises:
            DatabaseMismatch: ``explicit`` and the folder holds another database.
        """
        private_folder(self.storage)
        private_folder(self.logs)
        if self.meta.exists():
            stored = self.read_bootstrap()
            if explicit and stored != bootstrap:
                raise DatabaseMismatch(
                    f"{self.storage} holds database {format_key(stored)}, not "
                    f"{format_key(bootstrap)}; use another --storage folder")
            return stored
        write_atomically(self.meta, (json.dumps({"format": FORMAT, "bootstrap": bootstrap.hex()})
                                     + "\n").encode())
        return bootstrap
