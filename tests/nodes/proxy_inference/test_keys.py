"""The key cache on a real replica: one query per secret, answers kept in memory, and a
change by another writer (a revocation, a new key) seen at once."""

from __future__ import annotations

import pytest
import trio

from crdt import Database, FsyncPolicy, PutApiKey, RevokeApiKey
from nodes.proxy_inference.keys import KeyCache
from p2p.keys import KeyPair
from tests.p2p.helpers import wait_until

ADMIN = KeyPair.from_seed(b"\x31" * 32)
PROXY = KeyPair.from_seed(b"\x32" * 32)


async def carry(admin: Database, proxy: Database) -> None:
    """Replicate the admin's log to the proxy's replica by hand."""
    start = proxy.lengths.get(ADMIN.public_key, 0)
    payloads, head = await admin.segment(ADMIN.public_key, start, 1 << 20)
    if payloads:
        await proxy.ingest(ADMIN.public_key, start, payloads, head)


async def test_answers_are_cached_and_refreshed_when_another_writer_changes(tmp_path, ticking,
                                                                            nursery):
    admin = await Database.open(tmp_path / "a", ADMIN, fsync=FsyncPolicy.NEVER)
    db = await Database.open(tmp_path / "p", PROXY, bootstrap=admin.bootstrap,
                             fsync=FsyncPolicy.NEVER)
    await admin.append([PutApiKey.with_secret("k1", "team", "n", "sk-one", [], 1)])
    await carry(admin, db)
    keys = KeyCache(db)
    await nursery.start(keys.run)
    with trio.fail_after(30):
        with pytest.raises(trio.WouldBlock):
            keys.lookup_nowait("sk-one")
        # Concurrent first lookups of one secret share one query.
        found = []
        async with trio.open_nursery() as lookups:
            for _ in range(5):
                lookups.start_soon(lambda: _append(found, keys.lookup("sk-one")))
        assert [k.id for k in found] == ["k1"] * 5 and keys.misses == 1
        assert keys.lookup_nowait("sk-one").id == "k1"
        assert await keys.lookup("sk-nobody") is None
        assert keys.lookup_nowait("sk-nobody") is None  # the unknown answer is kept too

        await admin.append([RevokeApiKey("k1", 2),
                            PutApiKey.with_secret("k2", "team", "n", "sk-nobody", [], 3)])
        await carry(admin, db)
        await wait_until(lambda: keys.refreshes >= 1, limit_s=10)
        assert keys.lookup_nowait("sk-one").revoked
        assert (await keys.lookup("sk-nobody")).id == "k2"  # forgotten, asked again
    await db.aclose()
    await admin.aclose()


async def _append(into: list, awaitable) -> None:
    into.append(await awaitable)
