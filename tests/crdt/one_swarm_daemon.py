"""A daemon's shape, as a real process: one swarm hosting the shared database's
replication and an RPC service of its own that authorises callers by key.

    python -m tests.crdt.one_swarm_daemon STORAGE ALLOWED_KEY_HEX

Prints one line ``ready <swarm key> <host>:<port> <database key>`` once both
services serve, then runs until killed.
"""

from __future__ import annotations

import functools
import sys

import pydantic
import trio

from crdt import FsyncPolicy, run_database_service
from p2p.host import RpcService
from p2p.keys import format_key, load_or_create_keypair, parse_public_key
from p2p.rpc import CallContext, Method, Router, RpcError
from p2p.swarm import Swarm, SwarmConfig
from tests.crdt.helpers import usage_ops

PROTOCOL = "test-whoami/1"


class Empty(pydantic.BaseModel):
    pass


class Hello(pydantic.BaseModel):
    caller: str


HELLO = Method("hello", Empty, Hello)


def whoami_service(allowed: bytes) -> RpcService:
    async def hello(params: Empty, ctx: CallContext) -> Hello:
        if ctx.remote_public_key != allowed:
            raise RpcError("NOT_ALLOWED", "this key may not call hello")
        return Hello(caller=format_key(ctx.remote_public_key))

    router = Router()
    router.add(HELLO, hello)
    return RpcService(PROTOCOL, router)


async def main(storage: str, allowed: bytes) -> None:
    keypair = load_or_create_keypair(storage)
    swarm = Swarm(keypair, config=SwarmConfig(host="127.0.0.1", dht_persistent=True),
                  services=[whoami_service(allowed)])
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(swarm.run)
        service = await nursery.start(functools.partial(
            run_database_service, storage, swarm=swarm, fsync=FsyncPolicy.NEVER,
            readers=frozenset({allowed})))  # a read-only replica it serves
        await service.db.append_many(usage_ops("k1", 25))
        print(f"ready {keypair.hex} {host}:{port} {format_key(service.db.bootstrap)}",
              flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], parse_public_key(sys.argv[2]))
