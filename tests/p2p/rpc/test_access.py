"""A router's guard and the access table: who may call which method.

The guard runs before a request is routed: a refused call never reaches its
handler, its params are not read, and a method the table does not name is
refused like one the caller lacks the role for.
"""

from __future__ import annotations

import logging

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from p2p.rpc import AccessTable, Method, Router, RpcClient, RpcError, StreamMethod
from tests.p2p.mux_pairs import rpc_client_of


class Params(BaseModel):
    n: int


class Loose(BaseModel):
    n: str


class Item(BaseModel):
    n: int


READ = Method("things.read", params=Params, result=Params)
WRITE = Method("things.write", params=Params, result=Params)
FOLLOW = StreamMethod("things.follow", params=Params, item=Item)
LOOSE_READ = Method("things.read", params=Loose, result=Params)
NOWHERE = Method("things.nowhere", params=Params, result=Params)

ADMIN, READER, STRANGER = b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32
TABLE = {"things.read": {"admin", "reader"}, "things.follow": {"reader"},
         "things.write": {"admin"}}
ROLES = {ADMIN: {"admin"}, READER: {"reader"}}


def make_router(ran: list[str]) -> tuple[Router, AccessTable]:
    access = AccessTable("things", TABLE, lambda key: ROLES.get(key, ()), hint="ask an admin")
    router = Router(guard=access.check)

    async def read(params, ctx):
        ran.append("read")
        return params

    async def write(params, ctx):
        ran.append("write")
        return params

    async def follow(params, ctx):
        ran.append("follow")
        yield Item(n=params.n)

    router.add(READ, read)
    router.add(WRITE, write)
    router.add(FOLLOW, follow)
    return router, access


async def serve(nursery, router: Router, key: bytes | None) -> RpcClient:
    """A client of ``router`` as ``key``, open until the test's nursery ends."""
    async def run(task_status=trio.TASK_STATUS_IGNORED):
        async with rpc_client_of(nursery, router, key) as client:
            task_status.started(client)
            await trio.sleep_forever()

    return await nursery.start(run)


async def code_of(client: RpcClient, method, params) -> str | None:
    try:
        if isinstance(method, StreamMethod):
            async with client.stream(method, params) as items:
                async for _ in items:
                    pass
        else:
            await client.call(method, params)
    except RpcError as exc:
        return exc.code
    return None


@pytest.mark.parametrize(("key", "allowed"), [
    (ADMIN, {"things.read", "things.write"}),
    (READER, {"things.read", "things.follow"}),
    (STRANGER, set()),
    (None, set()),
])
async def test_each_caller_reaches_exactly_its_methods(nursery, autojump_clock, key, allowed):
    ran: list[str] = []
    router, access = make_router(ran)
    with trio.fail_after(10):
        client = await serve(nursery, router, key)
        for method in (READ, WRITE, FOLLOW):
            code = await code_of(client, method, Params(n=1))
            assert (code is None) == (method.name in allowed), (method.name, code)
            if code is not None:
                assert code == "FORBIDDEN"
    assert sorted(ran) == sorted(name.split(".")[1] for name in allowed)
    refused = access.statistics().refused
    assert sum(refused.values()) == 3 - len(allowed)


async def test_a_refused_call_is_refused_before_its_params_are_read(nursery, autojump_clock):
    ran: list[str] = []
    router, _ = make_router(ran)
    with trio.fail_after(10):
        stranger = await serve(nursery, router, STRANGER)
        # Bad params and an unknown method: FORBIDDEN, not INVALID_PARAMS or
        # UNKNOWN_METHOD (a stranger learns nothing of what is served).
        assert await code_of(stranger, LOOSE_READ, Loose(n="x")) == "FORBIDDEN"
        assert await code_of(stranger, NOWHERE, Params(n=1)) == "FORBIDDEN"
        admin = await serve(nursery, router, ADMIN)
        assert await code_of(admin, LOOSE_READ, Loose(n="x")) == "INVALID_PARAMS"
        # Not in the table: refused to the admin too, although nothing serves it.
        assert await code_of(admin, NOWHERE, Params(n=1)) == "FORBIDDEN"
    assert ran == []


async def test_the_refusal_says_what_the_method_needs_and_what_the_caller_is(
        nursery, autojump_clock, caplog):
    caplog.set_level(logging.WARNING, logger="p2p.rpc")
    router, _ = make_router([])
    with trio.fail_after(10):
        reader = await serve(nursery, router, READER)
        stranger = await serve(nursery, router, STRANGER)
        with pytest.raises(RpcError) as refused:
            await reader.call(WRITE, Params(n=1))
        assert "things.write is for admin only" in refused.value.message
        assert "is reader" in refused.value.message
        for _ in range(3):  # logged once per caller and method, however often refused
            with pytest.raises(RpcError) as refused:
                await stranger.call(READ, Params(n=1))
        assert "has no role at things (ask an admin)" in refused.value.message
    lines = [r.getMessage() for r in caplog.records if "rpc.forbidden" in r.getMessage()]
    assert len(lines) == 2
    assert "method=things.read" in lines[1] and "roles=none" in lines[1]


async def test_a_guard_that_fails_refuses(nursery, autojump_clock, caplog):
    ran: list[str] = []

    def broken(method: str, key: bytes | None) -> None:
        raise KeyError("a bug")

    router = Router(guard=broken)

    async def read(params, ctx):
        ran.append("read")
        return params

    router.add(READ, read)
    with trio.fail_after(10):
        client = await serve(nursery, router, ADMIN)
        assert await code_of(client, READ, Params(n=1)) == "INTERNAL"
    assert ran == []
    assert any("rpc.guard_failed" in r.getMessage() for r in caplog.records)


@given(method=st.one_of(st.sampled_from(sorted(TABLE)), st.text(max_size=80)),
       roles=st.sets(st.sampled_from(["admin", "reader", "other"])),
       key=st.one_of(st.none(), st.binary(min_size=32, max_size=32)))
def test_check_admits_exactly_when_a_role_of_the_caller_is_listed(method, roles, key):
    access = AccessTable("things", TABLE, lambda _: roles)
    expected = key is not None and bool(roles & TABLE.get(method, set()))
    try:
        access.check(method, key)
    except RpcError as exc:
        assert exc.code == "FORBIDDEN" and not expected
        assert len(exc.message) < 400  # a long method name is cut, not echoed whole
    else:
        assert expected
    assert access.allowed(method, key) == expected
    assert set(access.statistics().refused) <= set(TABLE) | {"(unlisted)"}
