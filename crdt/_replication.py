"""Replication over the swarm: pull what peers have, serve what we have.

Every replica joins the swarm topic derived from the database's bootstrap key
and, on every connection, both serves the ``cosmicac-db/1`` protocol
(:mod:`._messages`) and runs one pull loop against the peer:

0. if the peer serves a view checkpoint (admins make them) at least
   ``fast_forward_min_entries`` ahead of us, install it (:mod:`._checkpoint`):
   the view at once, then the gate; the logs still follow, not replayed;
1. ``heads`` (a long poll after the first round) gives the peer's lengths;
2. for every writer we replicate (every key ever admitted) where the peer is
   ahead, ``fetch`` runs of entries from our length, hold them until the
   signed head that ends a run arrives, and ingest them (chain and signature
   checked before anything is written, then gated and applied);
3. ingesting may admit new writers; their logs are fetched in the same round.

A peer that sends entries that fail verification, entries of a writer nobody
admitted, or answers that break the protocol is disconnected and refused for
``ban_s``; replication goes on with the other peers. One pull at a time per
writer: two peers ahead on the same log do not both send it.

A replica that is not yet a writer asks each peer to ``join`` it until an
admin whose allow-list holds its key appends ``add_writer`` for it.

Who may read (DESIGN.md §5): the logs hold every team's key ids, names,
scopes, secret hashes and usage, so ``heads`` and ``fetch`` answer only
:meth:`Replicator.may_read` keys: the writers admitted and not removed (in
this replica's view), the keys this replica admits when they ``join``
(``allow``: they are about to be writers; not once removed) and the
read-only replicas it is configured to serve (``readers``). Anyone else
gets ``NOT_ALLOWED`` (counted in ``crdt_reads_refused_total{method}``,
logged once per key). A replica pulls only from peers that may read its own
copy, and a ``NOT_ALLOWED`` answer to its own pull is waited out (it may be
admitted later), not treated as a broken peer. ``join`` and ``admin`` reveal
nothing of the data and keep their own checks (:data:`METHOD_ACCESS`).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from p2p.connection import Connection
from p2p.host import Service
from p2p.keys import derive_topic, format_key, verify_signature
from p2p.log import Head
from p2p.mux import Channel, ChannelRejected
from p2p.rpc import (
    CallContext,
    Router,
    RpcChannelClosed,
    RpcClient,
    RpcError,
    RpcTimeout,
    serve_rpc,
)

from ._checkpoint import (
    CheckpointHeader,
    CheckpointRefused,
    checkpoint_id,
    decode_clocks,
    decode_header,
    decode_state,
    verify_header,
    verify_page,
)
from ._database import Database
from ._errors import CrdtError, InvalidBatch, UnknownWriter, WriteRefused
from ._messages import (
    ADMIN,
    CHECKPOINT,
    CHECKPOINT_PAGE,
    FETCH,
    HEADS,
    JOIN,
    MAX_WRITERS,
    PROTOCOL,
    AdminParams,
    AdminResult,
    CheckpointPageParams,
    CheckpointPageResult,
    CheckpointParams,
    CheckpointResult,
    FetchParams,
    FetchResult,
    HeadModel,
    HeadsParams,
    HeadsResult,
    JoinParams,
    JoinResult,
    admin_message,
)

__all__ = ["METHOD_ACCESS", "PeerState", "ReplicationConfig", "Replicator",
           "replication_topic"]

log = logging.getLogger(__name__)

#: Entry bytes held for one writer while waiting for the head that ends a run.
MAX_PENDING_BYTES = 8 * 1024 * 1024
#: Entry bytes taken from one writer's log before turning to the next one:
#: logs that depend on each other then arrive side by side, so few entries
#: wait in the causal gate for another log's entries.
ROUND_BYTES = 1024 * 1024


#: Who may call each method of ``cosmicac-db/1``. ``reader``: only the keys
#: that may read (:meth:`Replicator.may_read`); ``anyone``: the handler checks
#: the caller itself (``join``: the admin's allow-list; ``admin``: the
#: replica's own signature) and answers nothing of the data. A method not
#: listed is refused (``NOT_ALLOWED``) to everyone.
METHOD_ACCESS: dict[str, str] = {
    HEADS.name: "reader",
    FETCH.name: "reader",
    # The view holds what the logs hold (every team's keys and usage).
    CHECKPOINT.name: "reader",
    CHECKPOINT_PAGE.name: "reader",
    JOIN.name: "anyone",
    ADMIN.name: "anyone",
}


def replication_topic(bootstrap: bytes) -> bytes:
    """The swarm topic every replica of database ``bootstrap`` joins."""
    return derive_topic("cosmicac/db", bootstrap)


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    #: Bytes asked for per ``fetch`` (at most MAX_FETCH_BYTES).
    fetch_bytes: int = 256 * 1024
    #: How long a ``heads`` long poll waits for a change.
    poll_s: float = 25.0
    #: Timeout of one call, on top of the poll's wait.
    call_timeout_s: float = 30.0
    #: How long a peer that sent bad data is refused.
    ban_s: float = 600.0
    #: First wait between ``join`` attempts refused with NOT_ALLOWED (doubles to 60 s).
    join_retry_s: float = 2.0
    #: Ask peers to admit us while we are not a writer.
    request_admission: bool = True
    #: Start from a peer's view checkpoint when it is at least this many
    #: entries ahead of us (0: never fast-forward).
    fast_forward_min_entries: int = 1_000
    #: Checkpoint pages asked for at once.
    checkpoint_pages_in_flight: int = 4
    #: An admin makes a checkpoint once this many entries were released since
    #: its last one (and on start, if it has entries)...
    checkpoint_every: int = 10_000
    #: ...or after this long with any new entry; never more often than
    #: ``checkpoint_min_interval_s`` (each costs a pass over the view and
    #: eight bytes per entry).
    checkpoint_max_age_s: float = 300.0
    checkpoint_min_interval_s: float = 10.0
    #: ...nor more often than it takes this share of the time (making one
    #: grows with the database: about 0.1 s per million entries and the view).
    checkpoint_max_share: float = 0.05


@dataclass
class PeerState:
    """One peer we replicate with."""

    key: bytes
    address: tuple[str, int]
    lengths: dict[bytes, int] = field(default_factory=dict)
    fetched: int = 0


class BadPeer(CrdtError):
    """A peer sent data that fails verification or breaks the protocol."""

    code = "BAD_PEER"


class Replicator(Service):
    """Keeps one database replicated with every peer on its swarm topic.

    A :class:`~p2p.host.Service` on the daemon's one swarm::

        replicator = Replicator(db, allow={proxy_key}, readers={backup_key})
        swarm.add_service(replicator)
        swarm.join(replicator.topic)

    It serves ``cosmicac-db/1`` to the peers that may read it (see the module
    doc; others get ``NOT_ALLOWED``), refuses peers it banned, and pulls from
    a peer that may read, once the replication topic led us to it or it
    opened the protocol to us (so the daemon's other peers, a CLI or an
    agent, are not asked for a database they do not have).

    Args:
        db: the replica.
        allow: keys this replica admits as writers when they ``join`` (it
            must itself be an admin); they may read too.
        readers: keys of read-only replicas this replica serves (e.g. a
            backup); with the admitted writers and ``allow``, the only keys
            that may read (``heads``, ``fetch``).
    """

    def __init__(self, db: Database, *, allow: Iterable[bytes] = (),
                 readers: Iterable[bytes] = (),
                 config: ReplicationConfig | None = None) -> None:
        self.db = db
        self.allow = frozenset(allow)
        self.readers = frozenset(readers)
        #: Keys whose refused read was logged (bounded: cleared when full).
        self._refusals_logged: set[bytes] = set()
        self.config = config or ReplicationConfig()
        self.topic = replication_topic(db.bootstrap)
        self.peers: dict[bytes, PeerState] = {}
        self._banned: dict[bytes, float] = {}
        self._writer_locks: defaultdict[bytes, trio.Lock] = defaultdict(trio.Lock)
        self._unknown_offers: dict[tuple[bytes, bytes], int] = {}
        self.changed = trio.Event()  # replaced whenever ``peers`` changes
        self.protocol = PROTOCOL
        self._router = Router(guard=self._guard)
        self._router.add(HEADS, self._heads)
        self._router.add(FETCH, self._fetch)
        self._router.add(JOIN, self._join)
        self._router.add(ADMIN, self._admin)
        self._router.add(CHECKPOINT, self._checkpoint)
        self._router.add(CHECKPOINT_PAGE, self._checkpoint_page)
        self._fast_forward_lock = trio.Lock()
        #: Connections whose peer opened our protocol to us: set once it does.
        self._spoke: weakref.WeakKeyDictionary[Connection, trio.Event] = (
            weakref.WeakKeyDictionary())

    @property
    def router(self) -> Router:
        """The methods served to every peer (guarded by :data:`METHOD_ACCESS`)."""
        return self._router

    def allows(self, remote_public_key: bytes, how: str) -> bool:
        return self.firewall(remote_public_key, how)

    def firewall(self, key: bytes, how: str) -> bool:
        """Refuse peers that sent bad data, for ``ban_s``."""
        until = self._banned.get(key)
        if until is None:
            return True
        if trio.current_time() >= until:
            del self._banned[key]
            return True
        return False

    # -- serving ------------------------------------------------------------------------

    async def serve_channel(self, channel: Channel, connection: Connection) -> None:
        self._spoken_event(connection).set()
        await serve_rpc(channel, self._router, connection=connection,
                        name=f"db-{connection.peer_label[:8]}")

    def _spoken_event(self, connection: Connection) -> trio.Event:
        event = self._spoke.get(connection)
        if event is None:
            event = self._spoke[connection] = trio.Event()
        return event

    def may_read(self, key: bytes) -> bool:
        """May ``key`` read this replica (``heads``, ``fetch``)? A configured reader,
        an admitted writer (not removed), or a key this admin admits on ``join``
        (unless it was removed: a removed key is never readmitted, so its place
        on the allow-list reads nothing either)."""
        if key in self.readers:
            return True
        admission = self.db.base.admission
        return admission.is_writer(key) or (key in self.allow and not admission.knows(key))

    def _guard(self, method: str, key: bytes | None) -> None:
        """The router's guard: every call passes it before it is routed."""
        need = METHOD_ACCESS.get(method)
        if need == "anyone" or (need == "reader" and key is not None and self.may_read(key)):
            return
        self.db.metrics.reads_refused.labels(method if need else "(unlisted)").inc()
        peer = "a caller with no proven key" if key is None else format_key(key)
        if key not in self._refusals_logged:
            if len(self._refusals_logged) >= MAX_WRITERS:
                self._refusals_logged.clear()
            self._refusals_logged.add(key)  # type: ignore[arg-type]
            log.warning("crdt.read_refused peer=%s method=%.66r reason=not a writer or reader",
                        "-" if key is None else format_key(key)[:16], method)
        raise RpcError("NOT_ALLOWED", f"{peer} may not read database "
                                      f"{format_key(self.db.bootstrap)[:16]}…: only its writers "
                                      "and the readers its replicas are configured with may; "
                                      f"ask its admin to add {peer} (add-writer, --allow or "
                                      "--reader)")

    def _check_db(self, db: bytes) -> None:
        if db != self.db.bootstrap:
            raise RpcError("WRONG_DB", f"this replica serves database "
                                       f"{format_key(self.db.bootstrap)}, not {format_key(db)}")

    async def _heads(self, params: HeadsParams, ctx: CallContext) -> HeadsResult:
        self._check_db(params.db)
        lengths = self.db.lengths
        if params.known is not None and params.wait_s > 0:
            lengths = await self.db.wait_changed(dict(params.known), params.wait_s)
        return HeadsResult(lengths=sorted(lengths.items())[:MAX_WRITERS])

    async def _fetch(self, params: FetchParams, ctx: CallContext) -> FetchResult:
        self._check_db(params.db)
        try:
            entries, head = await self.db.segment(params.writer, params.start, params.max_bytes)
        except KeyError:
            raise RpcError("UNKNOWN_WRITER", "this replica keeps no log for "
                                             f"{format_key(params.writer)}") from None
        except IndexError as exc:
            raise RpcError("OUT_OF_RANGE", str(exc)) from None
        model = None
        if head is not None:
            model = HeadModel(length=head.length, head_hash=head.head_hash,
                              signature=head.signature)
        return FetchResult(entries=entries, head=model)

    async def _join(self, params: JoinParams, ctx: CallContext) -> JoinResult:
        self._check_db(params.db)
        key = _caller(ctx)
        peer = format_key(key)
        admission = self.db.base.admission
        if admission.is_writer(key):
            return JoinResult(status="already")
        if not self.db.is_admin:
            raise RpcError("NOT_AN_ADMIN", f"{format_key(self.db.key)} is not an admin writer "
                                           "of this database; ask an admin")
        if admission.knows(key):
            self.db.metrics.admissions.labels("removed").inc()
            raise RpcError("REMOVED", f"{peer} was removed from this database; a removed "
                                      "key is never admitted again (use a new key)")
        if key not in self.allow:
            self.db.metrics.admissions.labels("not_allowed").inc()
            log.warning("crdt.join_refused peer=%s reason=not_allowed", peer)
            raise RpcError("NOT_ALLOWED", f"{peer} is not on the allow-list of admin "
                                          f"{format_key(self.db.key)}; restart it with "
                                          f"--allow {peer}")
        try:
            change = await self.db.change_writer("add_writer", key)
        except WriteRefused as exc:
            raise RpcError(exc.code, exc.message) from None
        self.db.metrics.admissions.labels(change.status).inc()
        log.info("crdt.writer_added writer=%s by=join", peer)
        return JoinResult(status="added" if change.status == "added" else "already")

    async def _admin(self, params: AdminParams, ctx: CallContext) -> AdminResult:
        self._check_db(params.db)
        caller = _caller(ctx)
        message = admin_message(params.db, caller, params.action, params.writer, params.admin)
        if not verify_signature(self.db.key, message, params.signature):
            raise RpcError("NOT_ALLOWED", "admin requests must be signed with this replica's "
                                          "own identity (run the command with its --storage)")
        try:
            change = await self.db.change_writer(params.action, params.writer,
                                                 admin=params.admin)
        except WriteRefused as exc:
            raise RpcError(exc.code, exc.message) from None
        log.info("crdt.writer_changed action=%s writer=%s status=%s by=operator",
                 params.action, format_key(params.writer)[:12], change.status)
        return AdminResult(status=change.status, length=change.length)

    async def _checkpoint(self, params: CheckpointParams, ctx: CallContext) -> CheckpointResult:
        self._check_db(params.db)
        checkpoint = self.db.checkpoint
        if checkpoint is None:
            raise RpcError("NO_CHECKPOINT", "this replica serves no checkpoint (only admins "
                                            "make them)")
        self.db.metrics.checkpoints.labels("served").inc()
        return CheckpointResult(header=checkpoint.header_bytes, signature=checkpoint.signature)

    async def _checkpoint_page(self, params: CheckpointPageParams,
                               ctx: CallContext) -> CheckpointPageResult:
        self._check_db(params.db)
        checkpoint = self.db.served_checkpoint(params.checkpoint)
        if checkpoint is None:
            raise RpcError("NO_CHECKPOINT", "that checkpoint is no longer kept; ask for the "
                                            "newest one")
        if params.page >= len(checkpoint.pages):
            raise RpcError("OUT_OF_RANGE", f"the checkpoint has {len(checkpoint.pages)} pages")
        return CheckpointPageResult(data=checkpoint.pages[params.page])

    # -- checkpoints ------------------------------------------------------------------

    async def keep_checkpoints(self) -> None:
        """While this replica is an admin, make a checkpoint on start and then every
        ``checkpoint_every`` released entries or ``checkpoint_max_age_s`` (run by
        the service until cancelled)."""
        config, db = self.config, self.db
        made_at = -math.inf
        made = 0  # entries the view held at the last checkpoint
        interval = config.checkpoint_min_interval_s
        while True:
            # The entries the view holds, as of the last write (read here, not
            # from the gate a worker thread may be changing).
            new = sum(db.applied.values()) - made
            age = trio.current_time() - made_at
            due = db.is_admin and new > 0 and (new >= config.checkpoint_every
                                               or age >= config.checkpoint_max_age_s
                                               or db.checkpoint is None)
            if due and age >= interval:
                began = trio.current_time()
                try:
                    checkpoint = await db.make_checkpoint(int(time.time() * 1000))
                except (CheckpointRefused, WriteRefused) as exc:
                    log.info("crdt.checkpoint_not_made code=%s reason=%s", exc.code, exc)
                else:
                    db.metrics.checkpoints.labels("made").inc()
                    made = sum(w.applied for w in checkpoint.header.writers)
                    log.info("crdt.checkpoint_made entries=%d pages=%d", made,
                             len(checkpoint.pages))
                made_at = trio.current_time()
                interval = max(config.checkpoint_min_interval_s,
                               (made_at - began) / max(config.checkpoint_max_share, 1e-3))
                continue
            wait = (interval - age if due
                    else config.checkpoint_max_age_s)
            await db.wait_changed(db.lengths, max(0.05, min(wait, config.checkpoint_max_age_s)))

    async def _fast_forward(self, client: RpcClient, state: PeerState) -> None:
        """Install the peer's checkpoint if it is far enough ahead of us; on any
        refusal, say why and go on (the full catch-up follows either way)."""
        minimum = self.config.fast_forward_min_entries
        if minimum <= 0 or self._fast_forward_lock.locked():
            return
        async with self._fast_forward_lock:
            db = self.db
            peer = format_key(state.key)[:12]
            try:
                answer = await client.call(CHECKPOINT, CheckpointParams(db=db.bootstrap),
                                           timeout_s=self.config.call_timeout_s)
            except RpcError as exc:
                if exc.code == "INVALID_RESULT":
                    raise BadPeer(f"bad checkpoint answer: {exc}", code="BAD_ANSWER") from None
                if exc.code not in ("NO_CHECKPOINT", "UNKNOWN_METHOD", "NOT_ALLOWED"):
                    raise
                log.debug("crdt.no_checkpoint peer=%s code=%s", peer, exc.code)
                return
            try:
                header = decode_header(answer.header)
                ahead = sum(w.applied for w in header.writers) - sum(db.applied.values())
                if ahead < minimum:
                    log.debug("crdt.checkpoint_skipped peer=%s ahead=%d", peer, ahead)
                    return
                verify_header(header, answer.header, answer.signature, db.bootstrap)
                if not db.base.admission.is_admin(header.signer):
                    raise CheckpointRefused(
                        f"the checkpoint is signed by {format_key(header.signer)[:12]}, not "
                        "an admin of this replica's database", code="NOT_AN_ADMIN")
                started = trio.current_time()
                ident = checkpoint_id(answer.header)
                state_bytes = await self._checkpoint_pages(
                    client, header, ident, range(header.state_pages))
                checked = await trio.to_thread.run_sync(decode_state, header, state_bytes)
                times: list[float] = []

                async def fetch_clocks():
                    times.append(trio.current_time())
                    data = await self._checkpoint_pages(client, header, ident,
                                                        header.clock_pages)
                    times.append(trio.current_time())
                    return await trio.to_thread.run_sync(decode_clocks, header, checked, data)

                gained = await db.install_checkpoint(header, checked, fetch_clocks)
            except CheckpointRefused as exc:
                db.metrics.checkpoints.labels(f"refused_{exc.code}").inc()
                log.warning("crdt.checkpoint_refused peer=%s code=%s reason=%s; replaying "
                            "every entry instead", peer, exc.code, exc)
                return
            db.metrics.checkpoints.labels("installed").inc()
            log.info("crdt.fast_forwarded peer=%s entries=%d gained=%d state_bytes=%d "
                     "clock_bytes=%d view_s=%.3f clocks_fetch_s=%.3f total_s=%.3f", peer,
                     header.released, gained, header.state_size, header.clocks_size,
                     times[0] - started, times[1] - times[0], trio.current_time() - started)

    async def _checkpoint_pages(self, client: RpcClient, header: CheckpointHeader,
                                ident: bytes, indexes: range) -> bytes:
        """Fetch these pages (a few at a time), each checked against the header."""
        pages: dict[int, bytes] = {}
        failed: list[Exception] = []
        limit = trio.CapacityLimiter(max(1, self.config.checkpoint_pages_in_flight))

        async def fetch(index: int, cancel: trio.CancelScope) -> None:
            try:
                async with limit:
                    reply = await client.call(
                        CHECKPOINT_PAGE, CheckpointPageParams(
                            db=self.db.bootstrap, checkpoint=ident, page=index),
                        timeout_s=self.config.call_timeout_s)
                verify_page(header, index, reply.data)
                pages[index] = reply.data
            except RpcError as exc:  # the first failure ends the fetch, raised as it is
                failed.append(CheckpointRefused(f"page {index}: {exc.code}", code="BAD_DIGEST")
                              if exc.code in ("NO_CHECKPOINT", "OUT_OF_RANGE",
                                              "INVALID_RESULT") else exc)
                cancel.cancel()
            except CheckpointRefused as exc:
                failed.append(exc)
                cancel.cancel()

        async with trio.open_nursery() as nursery:
            for index in indexes:
                nursery.start_soon(fetch, index, nursery.cancel_scope)
        if failed:
            raise failed[0]
        return b"".join(pages[index] for index in indexes)

    # -- pulling ------------------------------------------------------------------------

    async def on_connection(self, connection: Connection) -> None:
        """Replicate from this peer while it is connected, once we know it
        keeps this database (it came through our topic, or it asked us)."""
        key = connection.remote_public_key
        peer = format_key(key)[:12]
        spoke = self._spoken_event(connection)
        while self.topic not in connection.topics and not spoke.is_set():
            async with trio.open_nursery() as nursery:
                for wait in (spoke.wait, connection.wait_topics_changed):
                    nursery.start_soon(_then_cancel, wait, nursery.cancel_scope)
        # A peer that may not read our copy is not pulled from either: what a
        # stranger offers is not ours to store. It may be admitted later (its
        # add_writer arrives with a log): look again on every change.
        while not self.may_read(key):
            await self.db.wait_changed(self.db.lengths, math.inf)
        try:
            # Both ends open this protocol at once; a fresh id keeps the two
            # channels apart (same protocol and id would pair them up as one).
            channel = await connection.open_channel(PROTOCOL, secrets.token_bytes(8))
        except ChannelRejected:
            log.debug("crdt.peer_without_db peer=%s", peer)
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        state = PeerState(key, connection.remote_address or ("memory", 0))
        self.peers[key] = state
        self._peers_changed()
        client = RpcClient(channel, name=f"db-{peer}")
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(client.run)
                if self.config.request_admission and not self.db.is_writer:
                    nursery.start_soon(self._ask_to_join, client, peer)
                try:
                    await self._pull(client, state)
                finally:
                    nursery.cancel_scope.cancel()
        except* BadPeer as group:
            exc = group.exceptions[0]
            self._ban(key, exc.code if isinstance(exc, CrdtError) else "BAD_PEER", str(exc))
            with trio.CancelScope(shield=True):
                await connection.aclose()
        except* (RpcError, trio.BrokenResourceError, trio.ClosedResourceError) as group:
            # Gone, or stuck (a timeout): close, so the swarm reconnects afresh.
            log.debug("crdt.pull_ended peer=%s reason=%r", peer, group.exceptions[0])
            with trio.CancelScope(shield=True):
                await connection.aclose()
        finally:
            if self.peers.get(key) is state:
                del self.peers[key]
                self._peers_changed()

    def _ban(self, key: bytes, code: str, reason: str) -> None:
        self.db.metrics.bad_peers.labels(code).inc()
        self._banned[key] = trio.current_time() + self.config.ban_s
        log.error("crdt.peer_banned peer=%s code=%s reason=%s for_s=%.0f",
                  format_key(key)[:12], code, reason, self.config.ban_s)

    def _peers_changed(self) -> None:
        self.db.peer_count = len(self.peers)
        self.changed.set()
        self.changed = trio.Event()

    async def _pull(self, client: RpcClient, state: PeerState) -> None:
        db = self.db
        await self._fast_forward(client, state)
        known: list[tuple[bytes, int]] | None = None
        stalled = 0.0
        refused_wait = 0.0
        while True:
            wait_s = self.config.poll_s if known is not None else 0.0
            try:
                heads = await client.call(
                    HEADS, HeadsParams(db=db.bootstrap, known=known, wait_s=wait_s),
                    timeout_s=wait_s + self.config.call_timeout_s)
            except RpcError as exc:
                if exc.code == "INVALID_RESULT":
                    raise BadPeer(f"bad heads answer: {exc}", code="BAD_ANSWER") from None
                if exc.code == "NOT_ALLOWED":
                    # Not a reader there (yet): an admin may admit us (join, or
                    # an operator's add-writer), so ask again, slower each time.
                    refused_wait = (min(refused_wait * 2, 60.0) if refused_wait
                                    else self.config.join_retry_s)
                    log.log(logging.WARNING if refused_wait >= 60.0 else logging.INFO,
                            "crdt.read_refused_by_peer peer=%s retry_s=%.0f reason=%s",
                            format_key(state.key)[:12], refused_wait, exc.message)
                    await trio.sleep(refused_wait)
                    known = None
                    continue
                raise
            refused_wait = 0.0
            state.lengths = dict(heads.lengths)
            await self._catch_up(client, state)
            known = heads.lengths
            if self._still_behind(state):
                # It said it had more and gave none (it lost data, or it is lying):
                # ask again later, not in a tight loop at its pace.
                stalled = min(stalled * 2, self.config.poll_s) if stalled else 0.5
                log.info("crdt.peer_stalled peer=%s retry_s=%.1f", format_key(state.key)[:12],
                         stalled)
                await trio.sleep(stalled)
                known = None
            else:
                stalled = 0.0

    def _still_behind(self, state: PeerState) -> bool:
        lengths, wanted = self.db.lengths, self.db.wanted
        return any(n > lengths.get(w, 0) for w, n in state.lengths.items() if w in wanted)

    async def _catch_up(self, client: RpcClient, state: PeerState) -> None:
        """Fetch every wanted log the peer is ahead on, until nothing more is wanted.

        Round-robin, about ROUND_BYTES from each log in turn."""
        progress = True
        while progress:  # bounded: each pass adds entries or newly admitted writers
            progress = False
            for writer, length in state.lengths.items():
                if writer in self.db.wanted and length > self.db.lengths.get(writer, 0):
                    progress |= await self._fetch_writer(client, state, writer, length)
        for writer, length in state.lengths.items():
            if writer not in self.db.wanted:
                self._note_unknown(state.key, writer, length)

    def _note_unknown(self, peer: bytes, writer: bytes, length: int) -> None:
        """A peer offers a log no admin admitted: count its entries as refused, once."""
        seen = self._unknown_offers.get((peer, writer), 0)
        if length > seen:
            if len(self._unknown_offers) >= 4 * MAX_WRITERS:
                self._unknown_offers.clear()
            self._unknown_offers[(peer, writer)] = length
            self.db.metrics.refused.labels("UNKNOWN_WRITER").inc(length - seen)
            log.warning("crdt.unknown_writer peer=%s writer=%s entries=%d (not admitted here)",
                        format_key(peer)[:12], format_key(writer)[:12], length)

    async def _fetch_writer(self, client: RpcClient, state: PeerState, writer: bytes,
                            their_length: int) -> bool:
        async with self._writer_locks[writer]:
            start = self.db.lengths.get(writer, 0)
            pending: list[bytes] = []
            pending_bytes = taken = 0
            progressed = False
            while start + len(pending) < their_length and taken < ROUND_BYTES:
                reply = await self._call_fetch(client, writer, start + len(pending))
                if not reply.entries:
                    if reply.head is None:
                        break  # it had less than it said (e.g. it restarted)
                    raise BadPeer("a head with no entries", code="BAD_ANSWER")
                pending.extend(reply.entries)
                pending_bytes += sum(map(len, reply.entries))
                if pending_bytes > MAX_PENDING_BYTES:
                    raise BadPeer(f"more than {MAX_PENDING_BYTES} bytes of entries without a "
                                  "signed head", code="RUN_TOO_LARGE")
                if reply.head is None:
                    continue
                head = Head(reply.head.length, reply.head.head_hash, reply.head.signature)
                try:
                    await self.db.ingest(writer, start, pending, head)
                except (InvalidBatch, UnknownWriter) as exc:
                    raise BadPeer(f"log of {format_key(writer)[:12]}: {exc}",
                                  code=exc.code) from None
                state.fetched += len(pending)
                taken += pending_bytes
                progressed = True
                start = max(start + len(pending), self.db.lengths.get(writer, 0))
                pending, pending_bytes = [], 0
            return progressed

    async def _call_fetch(self, client: RpcClient, writer: bytes, start: int) -> FetchResult:
        params = FetchParams(db=self.db.bootstrap, writer=writer, start=start,
                             max_bytes=self.config.fetch_bytes)
        try:
            return await client.call(FETCH, params, timeout_s=self.config.call_timeout_s)
        except (RpcChannelClosed, RpcTimeout):
            raise
        except RpcError as exc:
            if exc.code == "INVALID_RESULT":
                raise BadPeer(f"bad fetch answer: {exc}", code="BAD_ANSWER") from None
            # It no longer has what it listed (OUT_OF_RANGE, UNKNOWN_WRITER) or is
            # busy: nothing from it this round; the stall back-off takes over.
            log.info("crdt.fetch_refused writer=%s code=%s", format_key(writer)[:12], exc.code)
            return FetchResult(entries=[])

    # -- asking to be admitted ---------------------------------------------------------------

    async def _ask_to_join(self, client: RpcClient, peer: str) -> None:
        wait = self.config.join_retry_s
        while not self.db.is_writer:
            try:
                result = await client.call(JOIN, JoinParams(db=self.db.bootstrap),
                                           timeout_s=self.config.call_timeout_s)
            except RpcError as exc:
                if exc.code in ("NOT_AN_ADMIN", "REMOVED", "WRONG_DB", "UNKNOWN_METHOD"):
                    log.info("crdt.join_declined peer=%s code=%s", peer, exc.code)
                    return
                log.warning("crdt.join_refused peer=%s code=%s reason=%s", peer, exc.code,
                            exc.message)
                await trio.sleep(wait)
                wait = min(wait * 2, 60.0)
                continue
            log.info("crdt.join_accepted peer=%s status=%s", peer, result.status)
            # The add_writer entry reaches us through replication; ask again
            # only if it has not after a while (the admin may have crashed).
            with trio.move_on_after(max(wait, 10.0) * 3):
                while not self.db.is_writer:
                    await self.db.wait_changed(self.db.lengths, math.inf)


def _caller(ctx: CallContext) -> bytes:
    """The caller's proven key; the protocol is only served over secret streams."""
    if ctx.remote_public_key is None:
        raise RpcError("NOT_ALLOWED", "this call needs an authenticated caller")
    return ctx.remote_public_key


async def _then_cancel(wait, scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()
