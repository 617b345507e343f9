"""wrk-ork's own SQLite file: jobs, replicas, racks, reservations, the outbox.

Theory of operation
-------------------
The orchestrator keeps its state in memory and writes what each call changed
here, in one transaction per call (:meth:`Store.transaction`): the jobs and
their replicas, the operations that call queued for the workers (the
*outbox*), and the queue position of the report it applied. So after a crash
wrk-ork reopens to exactly the state of its last completed call: an operation
is in the outbox if and only if the state change that made it was saved, and a
report is applied at most once (the daemon resumes reading each rack's queue
after its saved position). Operations leave the outbox when the daemon has
published them durably (:meth:`Store.remove_outbound`); one published twice
after a crash carries the same ``op_id``, which the worker recognises.

The file is WAL-journaled (readers never block the one writer; a commit is one
append) with ``synchronous=FULL``: a call that returned is on disk. The schema
carries its version in ``PRAGMA user_version``; a file from a newer wrk-ork is
refused rather than misread.

Tables (JSON columns hold the pydantic models of :mod:`contracts.model` and
:mod:`contracts.operations`)::

    jobs(id PK, seq, spec JSON, status, reason, created_at, updated_at, rack,
         restarting, deleting, unplaceable, owner)
    replicas(job_id, idx, status, generation, placement JSON|NULL, claimed,
             message, agents, gateway JSON|NULL; PK(job_id, idx))
    racks(key PK, location, name, registered_at, report JSON|NULL, silent)
    reservations(rack, node, team; PK(rack, node))
    outbox(seq PK AUTOINCREMENT, op_id UNIQUE, rack, op JSON)
    positions(rack PK, position)
    shell_keys(team PK, version, keys JSON)          (added to any file)

Blocking: every call is a small local write; the daemon may run the
orchestrator in a worker thread (SQLite connections here allow it, one thread
at a time) if fsync latency matters.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from contracts.gateway import GatewayView
from contracts.model import JobSpec, JobStatus, RackReport, ReplicaPlacement
from contracts.operations import (
    CreateReplica,
    DeleteReplica,
    Operation,
    RestartReplica,
    SetShellKeys,
)
from contracts.ork import ReplicaStatus
from contracts.shell_access import ShellKeys
from nodes.kit.sqlite import NotThisStore, Schema, SchemaTooNew, connect, immediate, migrate
from p2p.files import private_file

from .errors import StoreError

__all__ = [
    "SCHEMA_VERSION",
    "JobRecord",
    "Outbound",
    "RackRecord",
    "ReplicaRecord",
    "Store",
]

_SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    spec TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    rack TEXT,
    restarting INTEGER NOT NULL,
    deleting INTEGER NOT NULL,
    unplaceable INTEGER NOT NULL,
    owner TEXT
);
CREATE TABLE replicas (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    status TEXT NOT NULL,
    generation INTEGER NOT NULL,
    placement TEXT,
    claimed INTEGER NOT NULL,
    message TEXT NOT NULL,
    agents TEXT NOT NULL DEFAULT '',
    gateway TEXT,
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE racks (
    key TEXT PRIMARY KEY,
    location TEXT NOT NULL,
    name TEXT,
    registered_at REAL NOT NULL,
    report TEXT,
    silent INTEGER NOT NULL
);
CREATE TABLE reservations (
    rack TEXT NOT NULL,
    node TEXT NOT NULL,
    team TEXT NOT NULL,
    PRIMARY KEY (rack, node)
);
CREATE TABLE outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    op_id TEXT NOT NULL UNIQUE,
    rack TEXT NOT NULL,
    op TEXT NOT NULL
);
CREATE TABLE positions (
    rack TEXT PRIMARY KEY,
    position INTEGER NOT NULL
);
"""

_OPERATION: TypeAdapter[CreateReplica | RestartReplica | DeleteReplica | SetShellKeys] = \
    TypeAdapter(Operation)

#: Added without a schema bump: created on open when missing (older files too).
_SHELL_KEYS_TABLE = """CREATE TABLE IF NOT EXISTS shell_keys (
    team TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    keys TEXT NOT NULL
)"""

_LADDER = Schema(create=_SCHEMA, upgrades=(
    # Version 2 records the replicas' agent keys (proxy-inference trusts them).
    "ALTER TABLE replicas ADD COLUMN agents TEXT NOT NULL DEFAULT ''",
    # Version 3 records who created each job (per-user GPU quotas); older jobs have
    # no owner and count for their team only.
    "ALTER TABLE jobs ADD COLUMN owner TEXT",
    # Version 4 records an isolated network's WireGuard gateway (contracts/gateway.py).
    "ALTER TABLE replicas ADD COLUMN gateway TEXT",
))
#: The newest schema: older files climb ``_LADDER`` when opened.
SCHEMA_VERSION = _LADDER.version


@dataclass(frozen=True, slots=True)
class Outbound:
    """An operation for ``rack``'s worker, saved but not yet published."""

    #: The worker's public key (hex).
    rack: str
    op: CreateReplica | RestartReplica | DeleteReplica | SetShellKeys

    @property
    def op_id(self) -> str:
        return self.op.op_id


@dataclass(slots=True)
class ReplicaRecord:
    """One replica as stored; the orchestrator mutates it and saves its job."""

    index: int
    status: ReplicaStatus
    generation: int = 0
    placement: ReplicaPlacement | None = None
    #: Its placement's GPUs are claimed in the cluster (from PLACED until the
    #: worker reports DELETED).
    claimed: bool = False
    #: The worker's latest System log line about it.
    message: str = ""
    #: Public keys (hex) of its agents, by node rank, as the worker last reported.
    agents: tuple[str, ...] = ()
    #: Its isolated network's gateway, as the worker last reported it.
    gateway: GatewayView | None = None


@dataclass(slots=True)
class JobRecord:
    """One job as stored."""

    id: str
    #: Creation order: Pending jobs are placed oldest first, ties by seq.
    seq: int
    spec: JobSpec
    status: JobStatus
    reason: str
    created_at: float
    updated_at: float
    #: The rack its replicas are placed on (all on one), once placed.
    rack: str | None = None
    restarting: bool = False
    deleting: bool = False
    unplaceable: bool = False
    replicas: dict[int, ReplicaRecord] = field(default_factory=dict)
    #: Who created it (app-node's user id), for per-user GPU quotas; None: not said.
    owner: str | None = None


@dataclass(slots=True)
class RackRecord:
    """A registered rack: a worker's key, its location and last capacity report."""

    key: str
    location: str
    name: str | None
    registered_at: float
    report: RackReport | None = None
    #: It sent nothing for ``unknown_after_s``: its jobs are Unknown until it
    #: reports again (kept across a restart of wrk-ork).
    silent: bool = False


class Store:
    """The SQLite file (or an in-memory database) behind one orchestrator.

    Use :meth:`open`; write only inside :meth:`transaction`.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path | None) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: Path | None) -> Store:
        """Open (creating if needed) the store at ``path``; ``None``: in memory.

        Raises:
            StoreError: the file is not a wrk-ork store this version can read.
        """
        where = ":memory:" if path is None else str(path)
        try:
            if path is not None:
                private_file(path)  # job specs and team ids; -wal/-shm inherit its mode
            conn = connect(path, synchronous="FULL", foreign_keys=True)
            store = cls(conn, path)
            migrate(conn, _LADDER)
            conn.execute(_SHELL_KEYS_TABLE)
        except SchemaTooNew as exc:
            raise StoreError(f"{path} has schema {exc.found}, newer than this wrk-ork's "
                             f"{exc.supported}; run the newer wrk-ork or restore a backup"
                             ) from None
        except (sqlite3.DatabaseError, OSError, NotThisStore) as exc:
            raise StoreError(f"cannot open wrk-ork's store {where}: {exc}; "
                             "check the path and its permissions") from exc
        return store

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic write: everything inside commits together or not at all."""
        with immediate(self._conn):
            yield

    # -- jobs -----------------------------------------------------------------------

    def save_job(self, job: JobRecord) -> None:
        """Write the job and replace its replica rows."""
        self._conn.execute(
            "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (job.id, job.seq, job.spec.model_dump_json(), job.status.value, job.reason,
             job.created_at, job.updated_at, job.rack, int(job.restarting),
             int(job.deleting), int(job.unplaceable), job.owner))
        self._conn.execute("DELETE FROM replicas WHERE job_id = ?", (job.id,))
        self._conn.executemany(
            "INSERT INTO replicas VALUES (?,?,?,?,?,?,?,?,?)",
            [(job.id, r.index, r.status.value, r.generation,
              None if r.placement is None else r.placement.model_dump_json(),
              int(r.claimed), r.message, ",".join(r.agents),
              None if r.gateway is None else r.gateway.model_dump_json())
             for r in job.replicas.values()])

    def delete_job(self, job_id: str) -> None:
        self._conn.execute("DELETE FROM replicas WHERE job_id = ?", (job_id,))
        self._conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def load_jobs(self) -> list[JobRecord]:
        """Every job with its replicas, oldest first."""
        try:
            jobs: dict[str, JobRecord] = {}
            for row in self._conn.execute("SELECT * FROM jobs ORDER BY seq"):
                (job_id, seq, spec, status, reason, created_at, updated_at, rack,
                 restarting, deleting, unplaceable, owner) = row
                jobs[job_id] = JobRecord(
                    id=job_id, seq=seq, spec=JobSpec.model_validate_json(spec),
                    status=JobStatus(status), reason=reason, created_at=created_at,
                    updated_at=updated_at, rack=rack, restarting=bool(restarting),
                    deleting=bool(deleting), unplaceable=bool(unplaceable), owner=owner)
            for row in self._conn.execute("SELECT * FROM replicas ORDER BY job_id, idx"):
                (job_id, idx, status, generation, placement, claimed, message, agents,
                 gateway) = row
                jobs[job_id].replicas[idx] = ReplicaRecord(
                    index=idx, status=ReplicaStatus(status), generation=generation,
                    placement=(None if placement is None
                               else ReplicaPlacement.model_validate_json(placement)),
                    claimed=bool(claimed), message=message,
                    agents=tuple(agents.split(",")) if agents else (),
                    gateway=None if gateway is None else GatewayView.model_validate_json(gateway))
        except (ValidationError, ValueError, KeyError) as exc:
            raise StoreError(f"a job row in {self.path} cannot be read ({exc}); "
                             "restore a backup of the store") from exc
        return list(jobs.values())

    # -- racks and reservations ----------------------------------------------------

    def save_rack(self, rack: RackRecord) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO racks VALUES (?,?,?,?,?,?)",
            (rack.key, rack.location, rack.name, rack.registered_at,
             None if rack.report is None else rack.report.model_dump_json(), int(rack.silent)))

    def delete_rack(self, key: str) -> None:
        self._conn.execute("DELETE FROM racks WHERE key = ?", (key,))
        self._conn.execute("DELETE FROM reservations WHERE rack = ?", (key,))
        self._conn.execute("DELETE FROM positions WHERE rack = ?", (key,))

    def load_racks(self) -> list[RackRecord]:
        try:
            return [RackRecord(key=key, location=location, name=name,
                               registered_at=registered_at,
                               report=(None if report is None
                                       else RackReport.model_validate_json(report)),
                               silent=bool(silent))
                    for key, location, name, registered_at, report, silent in self._conn.execute(
                        "SELECT * FROM racks ORDER BY registered_at, key")]
        except ValidationError as exc:
            raise StoreError(f"a rack row in {self.path} cannot be read ({exc}); "
                             "restore a backup or register the rack again") from exc

    def save_reservation(self, rack: str, node: str, team: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO reservations VALUES (?,?,?)",
                           (rack, node, team))

    def delete_reservation(self, rack: str, node: str) -> None:
        self._conn.execute("DELETE FROM reservations WHERE rack = ? AND node = ?", (rack, node))

    def load_reservations(self) -> list[tuple[str, str, str]]:
        """(rack, node, team) of every reservation."""
        return [tuple(row) for row in self._conn.execute(
            "SELECT rack, node, team FROM reservations ORDER BY rack, node")]

    # -- shell keys -------------------------------------------------------------------

    def save_shell_keys(self, keys: ShellKeys) -> None:
        self._conn.execute("INSERT OR REPLACE INTO shell_keys VALUES (?,?,?)",
                           (keys.team, keys.version, json.dumps(list(keys.keys))))

    def load_shell_keys(self) -> dict[str, ShellKeys]:
        try:
            return {team: ShellKeys(team=team, version=version, keys=tuple(json.loads(keys)))
                    for team, version, keys in self._conn.execute(
                        "SELECT team, version, keys FROM shell_keys")}
        except (ValidationError, ValueError) as exc:
            raise StoreError(f"a shell_keys row in {self.path} cannot be read ({exc}); "
                             "app-node sends every team's keys again after it restarts") from exc

    # -- outbox and report positions ---------------------------------------------------

    def add_outbound(self, outbound: Outbound) -> None:
        """Queue an operation; one whose ``op_id`` is already queued is not added twice."""
        self._conn.execute(
            "INSERT OR IGNORE INTO outbox (op_id, rack, op) VALUES (?,?,?)",
            (outbound.op.op_id, outbound.rack, outbound.op.model_dump_json()))

    def remove_outbound(self, op_ids: Iterable[str]) -> None:
        self._conn.executemany("DELETE FROM outbox WHERE op_id = ?",
                               [(op_id,) for op_id in op_ids])

    def outbox(self) -> list[Outbound]:
        """Unpublished operations, in the order they were queued."""
        try:
            return [Outbound(rack=rack, op=_OPERATION.validate_python(json.loads(op)))
                    for rack, op in self._conn.execute(
                        "SELECT rack, op FROM outbox ORDER BY seq")]
        except (ValidationError, ValueError) as exc:
            raise StoreError(f"an outbox row in {self.path} cannot be read ({exc}); "
                             "restore a backup of the store") from exc

    def outbox_size(self) -> int:
        (count,) = self._conn.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return count

    def set_position(self, rack: str, position: int) -> None:
        self._conn.execute("INSERT OR REPLACE INTO positions VALUES (?,?)", (rack, position))

    def positions(self) -> dict[str, int]:
        """Per rack, the queue position of the last report applied."""
        return dict(self._conn.execute("SELECT rack, position FROM positions"))
