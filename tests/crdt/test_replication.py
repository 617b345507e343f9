"""Replication between replicas on swarms: admission, bad peers, partitions.

Most tests run every replica on its own host of a MemoryInternet under the
autojump clock (see ``CLOCK``); two stay on real sockets on 127.0.0.1 where
real sockets are the point (their docstrings say why).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from crdt import (
    AddTokenUsage,
    Database,
    DatabaseService,
    FsyncPolicy,
    ReplicationConfig,
    WriteRefused,
    run_database_service,
)
from crdt._messages import FetchResult
from crdt._replication import Replicator
from p2p.keys import KeyPair
from p2p.metrics import combined_registry, serve_metrics
from p2p.swarm import Swarm
from tests.crdt.helpers import usage_ops
from tests.p2p.helpers import http_get, wait_until
from tests.p2p.swarm.helpers import memory_swarm_net, swarm_net

FAST = ReplicationConfig(poll_s=2.0, call_timeout_s=5.0, join_retry_s=0.2, ban_s=60.0)


@pytest.fixture
def clock():
    """Trio's virtual clock for the in-memory tests, jumping only after 2 ms of
    real idleness rather than at once (``autojump_clock``): the database works
    in threads (``trio.to_thread``), and while one runs every task may be
    waiting on it. An immediate jump then runs trio time ahead through every
    timer (half an hour of it while one replica opened), past the tests' own
    deadlines. A thread op slower than 2 ms still lets the clock take a few
    steps; the timeouts here absorb that (checked with three runs at once on
    two cores)."""
    return trio.testing.MockClock(autojump_threshold=0.002)


@dataclass
class Replica:
    service: DatabaseService
    scope: trio.CancelScope
    stopped: trio.Event

    @property
    def db(self):
        return self.service.db

    @property
    def swarm(self) -> Swarm:
        return self.service.swarm

    async def stop(self) -> None:
        """Stop the replica and wait until its swarm and database are closed."""
        self.scope.cancel()
        await self.stopped.wait()


async def start_replica(net, storage, keypair, *, bootstrap=None, allow=(), readers=(),
                        firewall=None, replicator_class=None):
    """A daemon's shape: one swarm (on a host of its own), the database one service on it.

    ``replicator_class`` plugs a misbehaving replicator into the same swarm
    (through the public service API) instead of the real one."""
    scope, stopped = trio.CancelScope(), trio.Event()
    host, network = net.host()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    swarm = Swarm(keypair, config=net.config(host), network=network,
                                  firewall=firewall)
                    await nursery.start(swarm.run)
                    if replicator_class is None:
                        task_status.started(await nursery.start(functools.partial(
                            run_database_service, storage, swarm=swarm, bootstrap=bootstrap,
                            allow=frozenset(allow), readers=frozenset(readers),
                            fsync=FsyncPolicy.NEVER,
                            replication=FAST)))
                        return
                    db = await Database.open(storage, keypair, bootstrap=bootstrap,
                                             fsync=FsyncPolicy.NEVER)
                    try:
                        replicator = replicator_class(db, allow=allow, readers=readers,
                                                      config=FAST)
                        swarm.add_service(replicator)
                        swarm.join(replicator.topic)
                        task_status.started(DatabaseService(db, replicator, swarm))
                        await trio.sleep_forever()
                    finally:
                        with trio.CancelScope(shield=True):
                            await db.aclose()
        finally:
            stopped.set()

    service = await net.nursery.start(run)
    return Replica(service, scope, stopped)


async def serve_replica_metrics(nursery, replica):
    registry = combined_registry(replica.db.metrics.registry, replica.swarm.metrics.registry)
    return await nursery.start(functools.partial(serve_metrics, registry))


async def total_prompt(db, key_id="k1") -> int:
    return sum(u.prompt for u in await db.read(lambda v: v.usage(key_id)))


async def test_a_second_writer_asks_to_be_admitted_and_both_converge(tmp_path):
    """On real sockets: two replicas over the kernel's TCP and UDP, and the
    metrics endpoint read over real HTTP (hypercorn's own timers run on the
    real clock)."""
    a_key, b_key = KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(30):
        async with swarm_net() as net:
            a = await start_replica(net, tmp_path / "a", a_key, allow=[b_key.public_key])
            metrics_address = await serve_replica_metrics(net.nursery, a)
            await a.db.append_many(usage_ops("k1", 50))
            b = await start_replica(net, tmp_path / "b", b_key, bootstrap=a.db.bootstrap)
            await wait_until(lambda: b.db.is_writer, limit_s=15)
            await b.db.append([AddTokenUsage("k1", "m", "2026-11-29", prompt=1000)])
            await wait_until(lambda: a.db.lengths == b.db.lengths, limit_s=15)
            assert await total_prompt(a.db) == await total_prompt(b.db) == 1050
            assert await a.db.read(lambda v: v.dump()) == await b.db.read(lambda v: v.dump())
            added = a.db.metrics.registry.get_sample_value("crdt_admission_requests_total",
                                                            {"outcome": "added"})
            assert added == 1
            status, body = await http_get(metrics_address, "/metrics")
            assert status == 200
            assert b"crdt_entries 52.0" in body and b"swarm_connections" in body
            assert b"crdt_replication_peers 1.0" in body


async def test_a_reader_reads_but_cannot_write_and_a_key_on_no_list_gets_nothing(
        tmp_path, clock):
    """Regression: the logs hold every team's key inventory and usage,
    so a replica that is neither a writer nor a configured reader receives none
    of it (it used to receive everything)."""
    a_key, c_key, r_key = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(120):
        async with memory_swarm_net() as net:
            a = await start_replica(net, tmp_path / "a", a_key, allow=[],
                                    readers=[r_key.public_key])
            await a.db.append_many(usage_ops("k1", 5))
            c = await start_replica(net, tmp_path / "c", c_key, bootstrap=a.db.bootstrap)
            r = await start_replica(net, tmp_path / "r", r_key, bootstrap=a.db.bootstrap)
            await wait_until(lambda: r.db.lengths.get(a_key.public_key) == 5, limit_s=15)
            assert await total_prompt(r.db) == 5

            def sample(name, labels):
                return a.db.metrics.registry.get_sample_value(name, labels) or 0
            await wait_until(lambda: sample("crdt_reads_refused_total",
                                            {"method": "crdt.heads"}) >= 1, limit_s=15)
            await wait_until(lambda: sample("crdt_admission_requests_total",
                                            {"outcome": "not_allowed"}) >= 2, limit_s=15)
            assert c.db.lengths.get(a_key.public_key, 0) == 0
            assert await total_prompt(c.db) == 0
            for replica in (c, r):
                with pytest.raises(WriteRefused) as refused:
                    await replica.db.append([AddTokenUsage("k1", "m", "2026-11-29", prompt=1)])
                assert refused.value.code == "NOT_A_WRITER"


async def test_a_replica_refused_at_first_reads_once_an_operator_admits_it(tmp_path, clock):
    """`cosmicac db add-writer` on the admin, with the replica already connected:
    it was refused, waited, and now replicates (no restart, no new connection)."""
    a_key, c_key = KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(120):
        async with memory_swarm_net() as net:
            a = await start_replica(net, tmp_path / "a", a_key)
            await a.db.append_many(usage_ops("k1", 5))
            c = await start_replica(net, tmp_path / "c", c_key, bootstrap=a.db.bootstrap)
            await wait_until(lambda: (a.db.metrics.registry.get_sample_value(
                "crdt_reads_refused_total", {"method": "crdt.heads"}) or 0) >= 1, limit_s=15)
            await a.db.change_writer("add_writer", c_key.public_key)
            await wait_until(lambda: c.db.is_writer, limit_s=60)
            await wait_until(lambda: c.db.lengths.get(a_key.public_key, 0) >= 5, limit_s=60)
            await c.db.append([AddTokenUsage("k1", "m", "2026-11-29", prompt=1)])
            await wait_until(lambda: a.db.lengths.get(c_key.public_key) == 1, limit_s=60)


class _Tampering(Replicator):
    """Serves every log with one byte of its first entry changed."""

    async def _fetch(self, params, ctx):
        result = await super()._fetch(params, ctx)
        if result.entries:
            first = result.entries[0]
            tampered = first[:-1] + bytes([first[-1] ^ 1])
            result = FetchResult(entries=[tampered, *result.entries[1:]], head=result.head)
        return result


async def test_a_peer_that_sends_a_bad_entry_is_dropped_and_replication_goes_on(tmp_path, clock):
    a_key, m_key, c_key = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    # M and C are read-only replicas that A serves and that serve each other
    # (each replica serves only the readers it is configured with).
    readers = {"a": [m_key.public_key, c_key.public_key], "m": [c_key.public_key],
               "c": [m_key.public_key]}
    with trio.fail_after(120):
        async with memory_swarm_net() as net:
            a = await start_replica(net, tmp_path / "a", a_key, readers=readers["a"])
            await a.db.append_many(usage_ops("k1", 30))
            m = await start_replica(net, tmp_path / "m", m_key, bootstrap=a.db.bootstrap,
                                    readers=readers["m"], replicator_class=_Tampering)
            await wait_until(lambda: m.db.lengths.get(a_key.public_key) == 30, limit_s=15)
            await a.stop()  # C can only reach the tampering peer at first
            c = await start_replica(net, tmp_path / "c", c_key, bootstrap=a_key.public_key,
                                    readers=readers["c"])

            def bad_peers():
                return c.db.metrics.registry.get_sample_value(
                    "crdt_bad_peers_total", {"code": "BAD_CHAIN"}) or 0
            await wait_until(lambda: bad_peers() >= 1, limit_s=15)
            assert c.db.lengths.get(a_key.public_key, 0) == 0  # nothing from it was stored
            assert not c.service.replicator.firewall(m_key.public_key, "incoming")
            await wait_until(lambda: m_key.public_key not in c.service.swarm.connections, limit_s=5)
            a = await start_replica(net, tmp_path / "a", a_key,  # the honest peer comes back
                                    readers=readers["a"])
            await wait_until(lambda: c.db.lengths.get(a_key.public_key) == 30, limit_s=20)
            assert await total_prompt(c.db) == 30


async def test_writers_keep_writing_while_partitioned_and_converge_after(tmp_path, clock):
    keys = [KeyPair.generate() for _ in range(3)]
    blocked: set[frozenset[bytes]] = set()

    def firewall_of(me: bytes):
        return lambda peer, how: frozenset((me, peer)) not in blocked

    with trio.fail_after(120):
        async with memory_swarm_net() as net:
            first = await start_replica(net, tmp_path / "0", keys[0],
                                        allow=[k.public_key for k in keys[1:]],
                                        firewall=firewall_of(keys[0].public_key))
            replicas = [first] + [
                await start_replica(net, tmp_path / str(i), k, bootstrap=keys[0].public_key,
                                    firewall=firewall_of(k.public_key))
                for i, k in enumerate(keys[1:], 1)]
            await wait_until(lambda: all(r.db.is_writer for r in replicas), limit_s=20)
            # Cut replica 2 off from both others.
            lone = keys[2].public_key
            for other in keys[:2]:
                blocked.add(frozenset((lone, other.public_key)))
            for replica in replicas:
                for key, connection in list(replica.service.swarm.connections.items()):
                    if frozenset((replica.db.key, key)) in blocked:
                        await connection.aclose()
            for n, replica in enumerate(replicas):
                await replica.db.append_many(usage_ops("k1", 100 * (n + 1)))
            await wait_until(lambda: replicas[0].db.lengths == replicas[1].db.lengths, limit_s=15)
            assert replicas[2].db.lengths != replicas[0].db.lengths
            blocked.clear()  # heal
            await wait_until(lambda: all(r.db.lengths == replicas[0].db.lengths
                                         for r in replicas), limit_s=30)
            dumps = [await r.db.read(lambda v: v.dump()) for r in replicas]
            assert dumps[0] == dumps[1] == dumps[2]
            assert await total_prompt(replicas[2].db) == 600


async def test_operator_writer_changes_must_be_signed_by_the_replica_itself(tmp_path):
    """On real sockets: the operator's request dials the daemon over real TCP,
    as ``cosmicac db add-writer`` does."""
    from crdt._operator import _ask_daemon

    a_key, b_key, stranger = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(30):
        async with swarm_net() as net:
            a = await start_replica(net, tmp_path / "a", a_key)

            async def ask(signer, action):
                return await _ask_daemon(signer, a_key.public_key, tmp_path / "a",
                                         a.swarm.address, 0, action, b_key.public_key, False)

            with pytest.raises(WriteRefused) as refused:
                await ask(stranger, "add_writer")  # signed by someone else's key
            assert refused.value.code == "NOT_ALLOWED"
            assert not a.db.base.admission.knows(b_key.public_key)
            result = await ask(a_key, "add_writer")
            assert result.status == "added" and a.db.base.admission.is_writer(b_key.public_key)
            result = await ask(a_key, "remove_writer")
            assert (result.status, result.length) == ("removed", 0)
            with pytest.raises(WriteRefused) as again:
                await ask(a_key, "add_writer")
            assert again.value.code == "REMOVED"


class _Boasting(Replicator):
    """Lists ten more entries of every log than it has, and hands out none of them."""

    heads_times: list[float] = []  # trio time of each ``heads`` call it answers

    async def _heads(self, params, ctx):
        type(self).heads_times.append(trio.current_time())
        result = await super()._heads(params, ctx)
        return type(result)(lengths=[(w, n + 10) for w, n in result.lengths])

    async def _fetch(self, params, ctx):
        return FetchResult(entries=[])


async def test_a_peer_that_lists_entries_it_never_sends_is_asked_again_slowly(tmp_path, clock):
    """The replica backs off from a peer that stalls, 0.5 s doubling up to
    ``poll_s``, where a loop at the peer's pace would ask hundreds of times a
    second; on the virtual clock the pauses are measured exactly."""
    a_key, c_key = KeyPair.generate(), KeyPair.generate()
    _Boasting.heads_times = []
    with trio.fail_after(120):
        async with memory_swarm_net() as net:
            a = await start_replica(net, tmp_path / "a", a_key, replicator_class=_Boasting,
                                    readers=[c_key.public_key])
            await a.db.append_many(usage_ops("k1", 3))
            c = await start_replica(net, tmp_path / "c", c_key, bootstrap=a_key.public_key)
            await wait_until(lambda: len(_Boasting.heads_times) >= 6, limit_s=30)
            times = _Boasting.heads_times[:6]
            pauses = [later - earlier for earlier, later in itertools.pairwise(times)]
            expected = [0.5, 1.0, 2.0, 2.0, 2.0]  # FAST.poll_s == 2.0 caps the doubling
            # Each pause is the back-off plus a few in-memory round trips.
            assert all(want <= got < want + 0.1
                       for got, want in zip(pauses, expected, strict=True)), pauses
            assert c.db.lengths.get(a_key.public_key, 0) == 0  # nothing taken as data
