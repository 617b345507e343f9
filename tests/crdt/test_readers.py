"""Who may read the shared database.

Every method of cosmicac-db/1 by every kind of caller: the admitted writers
(an admin, a writer), a key the admin admits on join, a configured reader,
a removed writer, a stranger and a caller with no proven key. Only the first
four may read (``crdt.heads``, ``crdt.fetch``, ``crdt.checkpoint``,
``crdt.checkpoint_page``: a checkpoint is the view, every team's keys and usage); ``crdt.join`` and
``crdt.admin`` answer everyone with their own checks and reveal no data; a
method nobody lists is refused.
"""

from __future__ import annotations

import logging

import pytest
import trio
from pydantic import BaseModel

from crdt import Database, FsyncPolicy
from crdt._messages import (
    ADMIN,
    CHECKPOINT,
    CHECKPOINT_PAGE,
    FETCH,
    HEADS,
    JOIN,
    PROTOCOL,
    AdminParams,
    CheckpointPageParams,
    CheckpointParams,
    FetchParams,
    HeadsParams,
    JoinParams,
)
from crdt._replication import METHOD_ACCESS, Replicator
from p2p.keys import KeyPair
from p2p.rpc import Method, RpcClient, RpcError
from tests.crdt.helpers import usage_ops
from tests.p2p.mux_pairs import rpc_client_of

KEYS = {name: KeyPair.generate().public_key
        for name in ("admin", "writer", "pending", "reader", "removed", "stranger")}
CALLERS = [*KEYS, "no key"]
READERS = {"admin", "writer", "pending", "reader"}
#: What each caller's join gets: admitted writers are writers already; the key
#: on the allow-list is added; a reader is not thereby a writer.
JOINED = {"admin": None, "writer": None, "pending": None, "reader": "NOT_ALLOWED",
          "removed": "REMOVED", "stranger": "NOT_ALLOWED", "no key": "NOT_ALLOWED"}


class Nothing(BaseModel):
    pass


async def admin_replica(storage) -> tuple[Database, Replicator]:
    db = await Database.open(storage, KeyPair.generate(), fsync=FsyncPolicy.NEVER)
    await db.append_many(usage_ops("k1", 5))
    await db.change_writer("add_writer", KEYS["admin"], admin=True)
    await db.change_writer("add_writer", KEYS["writer"])
    await db.change_writer("add_writer", KEYS["removed"])
    await db.change_writer("remove_writer", KEYS["removed"])
    await db.make_checkpoint(0)
    # The removed key stays on the allow-list (a stale config): it reads nothing.
    replicator = Replicator(db, allow=[KEYS["pending"], KEYS["removed"]],
                            readers=[KEYS["reader"]])
    return db, replicator


async def connect(nursery, replicator: Replicator, key: bytes | None) -> RpcClient:
    """A client of the replicator's methods as ``key``, open until the nursery ends."""
    async def run(task_status=trio.TASK_STATUS_IGNORED):
        async with rpc_client_of(nursery, replicator.router, key, protocol=PROTOCOL) as client:
            task_status.started(client)
            await trio.sleep_forever()

    return await nursery.start(run)


async def code(client: RpcClient, method, params) -> str | None:
    try:
        await client.call(method, params, timeout_s=10)
    except RpcError as exc:
        return exc.code
    return None


def test_every_method_served_has_its_line():
    assert set(METHOD_ACCESS) == {HEADS.name, FETCH.name, JOIN.name, ADMIN.name,
                                  CHECKPOINT.name, CHECKPOINT_PAGE.name}


@pytest.mark.parametrize("caller", CALLERS)
async def test_each_replication_method_answers_exactly_whom_it_is_meant_for(
        tmp_path, nursery, caller, caplog):
    caplog.set_level(logging.WARNING, logger="crdt._replication")
    with trio.fail_after(30):
        db, replicator = await admin_replica(tmp_path / "a")
        try:
            client = await connect(nursery, replicator, KEYS.get(caller))
            heads = await code(client, HEADS, HeadsParams(db=db.bootstrap))
            fetch = await code(client, FETCH, FetchParams(db=db.bootstrap, writer=db.key,
                                                          start=0))
            checkpoint = await code(client, CHECKPOINT, CheckpointParams(db=db.bootstrap))
            page = await code(client, CHECKPOINT_PAGE, CheckpointPageParams(
                db=db.bootstrap, checkpoint=db.checkpoint.id, page=0))
            admin = await code(client, ADMIN, AdminParams(
                db=db.bootstrap, action="add_writer", writer=KEYS["stranger"],
                signature=b"\x00" * 64))
            unlisted = await code(client, Method("crdt.dump", params=Nothing, result=Nothing),
                                  Nothing())
            lengths_before = dict(db.lengths)
            joined = await code(client, JOIN, JoinParams(db=db.bootstrap))
            refused = {method: db.metrics.registry.get_sample_value(
                "crdt_reads_refused_total", {"method": method}) or 0
                for method in (HEADS.name, FETCH.name, CHECKPOINT.name, CHECKPOINT_PAGE.name,
                               "(unlisted)")}
            stranger_is_writer = db.base.admission.is_writer(KEYS["stranger"])
        finally:
            await db.aclose()
    expected = None if caller in READERS else "NOT_ALLOWED"
    assert (heads, fetch, checkpoint, page) == (expected,) * 4
    assert admin == "NOT_ALLOWED"  # only the replica's own identity signs these
    assert not stranger_is_writer
    assert unlisted == "NOT_ALLOWED"
    assert joined == JOINED[caller]
    if caller != "pending":
        assert db.lengths == lengths_before  # only the allowed key's join wrote
    assert refused == {HEADS.name: 0 if expected is None else 1,
                       FETCH.name: 0 if expected is None else 1,
                       CHECKPOINT.name: 0 if expected is None else 1,
                       CHECKPOINT_PAGE.name: 0 if expected is None else 1, "(unlisted)": 1}
    logged = [r.getMessage() for r in caplog.records if "crdt.read_refused" in r.getMessage()]
    assert len(logged) == 1  # once per key, however many calls


async def test_a_stranger_reads_no_key_inventory_heads_or_entries(tmp_path, nursery):
    """The reproduction: a fresh key asks the admin replica for its heads
    and for the admin's log; both are refused and nothing of the data is sent."""
    with trio.fail_after(30):
        db, replicator = await admin_replica(tmp_path / "a")
        try:
            client = await connect(nursery, replicator, KeyPair.generate().public_key)
            with pytest.raises(RpcError) as refused:
                await client.call(HEADS, HeadsParams(db=db.bootstrap), timeout_s=10)
            assert refused.value.code == "NOT_ALLOWED"
            assert "may not read database" in refused.value.message
            for writer in (db.key, KEYS["writer"]):
                with pytest.raises(RpcError) as refused:
                    await client.call(FETCH, FetchParams(db=db.bootstrap, writer=writer,
                                                         start=0), timeout_s=10)
                assert refused.value.code == "NOT_ALLOWED"
                assert refused.value.data is None
        finally:
            await db.aclose()


async def test_a_writer_removed_later_reads_no_more(tmp_path, nursery):
    with trio.fail_after(30):
        db, replicator = await admin_replica(tmp_path / "a")
        try:
            client = await connect(nursery, replicator, KEYS["writer"])
            assert await code(client, HEADS, HeadsParams(db=db.bootstrap)) is None
            await db.change_writer("remove_writer", KEYS["writer"])
            assert await code(client, HEADS, HeadsParams(db=db.bootstrap)) == "NOT_ALLOWED"
        finally:
            await db.aclose()
