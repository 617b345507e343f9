"""Shared helpers for the shared-database tests: replicas on disk, syncing them by hand."""

from __future__ import annotations

import random
from pathlib import Path

from crdt import AddTokenUsage, FsyncPolicy
from crdt._base import Base
from p2p.keys import KeyPair


def open_replica(folder: Path, keypair: KeyPair, bootstrap: bytes | None = None, *,
                 fsync: FsyncPolicy = FsyncPolicy.NEVER) -> Base:
    return Base.open(folder, keypair, bootstrap=bootstrap, fsync=fsync)


def pull(into: Base, source: Base, *, max_bytes: int = 64 * 1024,
         rng: random.Random | None = None) -> int:
    """Copy into ``into`` every wanted entry ``source`` has (what replication does); rounds repeat
    until nothing more is wanted, as newly admitted writers become wanted. With ``rng``, the
    writers' logs are taken in a random order. Returns entries moved."""
    moved = 0
    for _ in range(16):  # bounded: each round admits at least one more writer or stops
        before = moved
        writers = sorted(into.wanted())
        if rng is not None:
            rng.shuffle(writers)
        for writer in writers:
            source_log = source.logs.get(writer)
            if source_log is None:
                continue
            while into.lengths().get(writer, 0) < source_log.length:
                start = into.lengths().get(writer, 0)
                entries, head = source.segment(writer, start, max_bytes)
                while head is None:
                    more, head = source.segment(writer, start + len(entries), max_bytes)
                    entries += more
                into.ingest(writer, start, entries, head)
                moved += len(entries)
        if moved == before:
            return moved
    raise AssertionError("replication did not settle in 16 rounds")


def usage_ops(key_id: str, n: int, *, model: str = "m", day: str = "2026-11-29") -> list:
    """``n`` one-op entries adding 1 prompt token each."""
    return [[AddTokenUsage(key_id, model, day, prompt=1, total=1, requests=1)] for _ in range(n)]
