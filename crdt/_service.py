"""A replica on the swarm: the database, its replicator, a swarm, metrics, a status file.

What a daemon that keeps the shared database runs (``cosmicac db serve``
today; app-node and proxy-inference embed the same thing). The status file
``<storage>/db/status.json`` lets ``cosmicac db status`` show the peers of a
running daemon without talking to it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from p2p.keys import KeyPair, format_key
from p2p.metrics import combined_registry, serve_metrics
from p2p.swarm import Firewall, Swarm, SwarmConfig

from ._database import Database
from ._log import FsyncPolicy
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
    address: tuple[str, int]
    metrics_address: tuple[str, int] | None


async def run_database_service(
    storage: str | os.PathLike[str],
    keypair: KeyPair,
    *,
    bootstrap: bytes | None = None,
    swarm_config: SwarmConfig | None = None,
    allow: frozenset[bytes] = frozenset(),
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
    replication: ReplicationConfig | None = None,
    firewall: Firewall | None = None,
    metrics_host: str = "127.0.0.1",
    metrics_port: int | None = None,
    task_status: trio.TaskStatus[DatabaseService] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open the replica in ``storage`` and replicate it until cancelled.

    Reports a :class:`DatabaseService` once the swarm listens and the topic
    is joined. ``firewall`` (the swarm's) is asked after the replicator's own,
    which refuses peers that sent bad data. Closes the database (after any
    write in progress) on the way out.

    Raises:
        DatabaseMismatch, LogCorrupted, LogInUse: opening failed (see :meth:`Base.open`).
        OSError: a port could not be bound.
    """
    db = await Database.open(storage, keypair, bootstrap=bootstrap, fsync=fsync)
    try:
        replicator = Replicator(db, allow=allow, config=replication)

        def allowed(key: bytes, how: str) -> bool:
            return replicator.firewall(key, how) and (firewall is None or firewall(key, how))

        swarm = Swarm(keypair, config=swarm_config, peer_handlers=replicator.handlers,
                      on_connection=replicator.on_connection, firewall=allowed)
        status_path = db.base.layout.status
        async with trio.open_nursery() as nursery:
            address = await nursery.start(swarm.run)
            swarm.join(replicator.topic, server=True, client=True)
            metrics_address = None
            if metrics_port is not None:
                registry = combined_registry(db.metrics.registry, swarm.metrics.registry)
                metrics_address = await nursery.start(
                    lambda task_status: serve_metrics(registry, host=metrics_host,
                                                      port=metrics_port,
                                                      task_status=task_status))
            nursery.start_soon(_keep_status_file, status_path, db, replicator, address)
            log.info("crdt.serving db=%s me=%s writer=%s admin=%s address=%s:%d",
                     format_key(db.bootstrap), format_key(db.key), db.is_writer, db.is_admin,
                     *address)
            task_status.started(DatabaseService(db, replicator, swarm, address, metrics_address))
    finally:
        with trio.CancelScope(shield=True):
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
        await trio.to_thread.run_sync(_write_atomically, path, json.dumps(document, indent=1))
        await trio.sleep(STATUS_INTERVAL_S)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text + "\n")
    os.replace(temporary, path)
