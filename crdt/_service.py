"""A replica on a daemon's swarm: the database, its replicator, a status file.

What a daemon that keeps the shared database runs (``cosmicac db serve``
today; app-node and proxy-inference embed the same thing). The status file
``<storage>/db/status.json`` lets ``cosmicac db status`` show the peers of a
running daemon without talking to it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from p2p.files import write_atomically
from p2p.keys import format_key
from p2p.log import FsyncPolicy
from p2p.swarm import Swarm

from ._database import Database
from ._replication import ReplicationConfig, Replicator

__all__ = ["DatabaseService", "run_database_service"]

log = logging.getLogger(__name__)

#: The status file is rewritten at most this often while things change.
STATUS_INTERVAL_S = 1.0


@dataclass
class DatabaseService:
    db: Database
    replicator: Replicator
    swarm: Swarm


async def run_database_service(
    storage: str | os.PathLike[str],
    *,
    swarm: Swarm,
    bootstrap: bytes | None = None,
    allow: frozenset[bytes] = frozenset(),
    readers: frozenset[bytes] = frozenset(),
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
    replication: ReplicationConfig | None = None,
    task_status: trio.TaskStatus[DatabaseService] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open the replica in ``storage`` and replicate it on ``swarm`` until cancelled.

    The replica's identity is the swarm's: a daemon is one peer, and the
    database is one of the services on its swarm, next to its others. The
    swarm must be running. Reports a :class:`DatabaseService` once the
    replicator serves and the topic is joined; its metrics are in
    ``db.metrics.registry`` for the daemon's one metrics endpoint. On the way
    out the service is removed from the swarm, the topic left and the
    database closed (after any write in progress).

    ``allow``: keys admitted as writers when they ask (this replica must be an
    admin); ``readers``: read-only replicas served. Only they and the admitted
    writers may read this replica (:meth:`Replicator.may_read`).

    Raises:
        DatabaseMismatch, LogCorrupted, LogInUse: opening failed (see :meth:`Base.open`).
    """
    db = await Database.open(storage, swarm.keypair, bootstrap=bootstrap, fsync=fsync)
    replicator: Replicator | None = None
    unreserve: Callable[[], None] | None = None
    try:
        replicator = Replicator(db, allow=allow, readers=readers, config=replication)
        swarm.add_service(replicator)
        # Its readers and writers (those admitted at run time too) keep their
        # connection slots under a flood of strangers.
        unreserve = swarm.add_reserved(replicator.may_read)
        swarm.join(replicator.topic, server=True, client=True)
        assert swarm.address is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep_status_file, db.base.layout.status, db, replicator,
                               swarm.address)
            nursery.start_soon(replicator.keep_checkpoints)
            log.info("crdt.serving db=%s me=%s writer=%s admin=%s address=%s:%d",
                     format_key(db.bootstrap), format_key(db.key), db.is_writer, db.is_admin,
                     *swarm.address)
            task_status.started(DatabaseService(db, replicator, swarm))
    finally:
        with trio.CancelScope(shield=True):
            if unreserve is not None:
                unreserve()
            if replicator is not None:
                swarm.remove_service(replicator.protocol)
                with trio.move_on_after(5):
                    try:
                        await swarm.leave(replicator.topic)
                    except Exception as exc:  # the swarm may be stopping too
                        log.debug("crdt.leave_failed reason=%r", exc)
            await trio.to_thread.run_sync(
                lambda: db.base.layout.status.unlink(missing_ok=True))
            await db.aclose()


def status_document(db: Database, replicator: Replicator, address: tuple[str, int]) -> dict:
    return {
        "pid": os.getpid(),
        "updated": time.time(),
        "key": db.key.hex(),
        "address": [address[0], address[1]],
        "peers": [
            {"key": peer.key.hex(), "address": f"{peer.address[0]}:{peer.address[1]}",
             "lengths": {writer.hex(): n for writer, n in peer.lengths.items()},
             "fetched": peer.fetched}
            for peer in replicator.peers.values()
        ],
    }


async def _keep_status_file(path: Path, db: Database, replicator: Replicator,
                            address: tuple[str, int]) -> None:
    while True:
        document = status_document(db, replicator, address)
        # A report rewritten every second and rebuilt after a crash: never fsynced.
        await trio.to_thread.run_sync(functools.partial(
            write_atomically, path, (json.dumps(document, indent=1) + "\n").encode(),
            sync=False))
        await trio.sleep(STATUS_INTERVAL_S)

