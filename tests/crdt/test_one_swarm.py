"""A daemon is one peer: one swarm hosting the database and an RPC service of its own.

The daemon runs as a real process (``one_swarm_daemon.py``); this test process
is the second peer: one connection carries both the database's replication
and calls to the daemon's own service, whose handler authorises by the
caller's key in its call context.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import trio

from crdt import Database, FsyncPolicy, Replicator
from p2p.keys import KeyPair, parse_public_key
from p2p.rpc import RpcClient, RpcError
from p2p.swarm import Swarm, SwarmConfig
from tests.cli.helpers import read_until
from tests.crdt.one_swarm_daemon import HELLO, PROTOCOL, Empty
from tests.p2p.helpers import wait_until

READY = re.compile(r"ready (\w{64}) ([\d.]+):(\d+) (\w{64})")


async def call_hello(nursery, connection) -> str:
    channel = await connection.open_channel(PROTOCOL)
    client = RpcClient(channel, name="hello")
    await nursery.start(client.run)  # ends with the connection
    return (await client.call(HELLO, Empty(), timeout_s=10)).caller


@pytest.mark.slow
async def test_one_swarm_serves_the_database_and_a_keyed_rpc_service_on_one_connection(
        tmp_path):
    allowed, refused = KeyPair.generate(), KeyPair.generate()
    command = [sys.executable, "-m", "tests.crdt.one_swarm_daemon", str(tmp_path / "daemon"),
               allowed.hex]
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE,
                                                stderr=subprocess.DEVNULL)
        try:
            match = await read_until(proc.stdout, READY)
            daemon_key = parse_public_key(match[1])
            address = (match[2], int(match[3]))
            database = parse_public_key(match[4])

            db = await Database.open(tmp_path / "me", allowed, bootstrap=database,
                                     fsync=FsyncPolicy.NEVER)
            try:
                replicator = Replicator(db)
                me = Swarm(allowed, config=SwarmConfig(host="127.0.0.1", bootstrap=(address,)),
                           services=[replicator])
                async with trio.open_nursery() as nursery:
                    await nursery.start(me.run)
                    me.join(replicator.topic, server=False, client=True)
                    # The database arrives over the swarm ...
                    await wait_until(lambda: db.lengths.get(daemon_key) == 25, limit_s=30)
                    # ... and the daemon's own service answers on the same connection.
                    assert list(me.connections) == [daemon_key]
                    connection = me.connections[daemon_key]
                    assert await call_hello(nursery, connection) == allowed.hex
                    assert me.connections[daemon_key] is connection
                    nursery.cancel_scope.cancel()
            finally:
                await db.aclose()

            # Another key reaches the same process; the handler refuses it by its key.
            other = Swarm(refused, config=SwarmConfig(host="127.0.0.1", bootstrap=(address,)))
            async with trio.open_nursery() as nursery:
                await nursery.start(other.run)
                connection = await other.connect(daemon_key, addresses=[address])
                with pytest.raises(RpcError) as info:
                    await call_hello(nursery, connection)
                assert info.value.code == "NOT_ALLOWED"
                nursery.cancel_scope.cancel()
            assert proc.returncode is None  # neither caller hurt the daemon
        finally:
            proc.kill()
            await proc.wait()
