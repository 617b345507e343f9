"""A stranger flooding a daemon over real sockets on 127.0.0.1.

Shared by the admission tests: silent sockets (from several loopback
addresses) and self-made keys that finish their handshakes, each opened again
whenever the daemon closes it, so the stranger holds on; and
:func:`admitted`, which says whether the daemon gave a peer a connection slot.
"""

from __future__ import annotations

import trio

from p2p.connection import dial_tcp
from p2p.host import PeerHost
from p2p.keys import KeyPair

from .p2p.helpers import wait_until

SILENT = 70
KEYS = 64
#: A socket or key the daemon closed is opened again after this pause: the
#: stranger holds on, at a rate the test machine can afford (at 0.2 s, the
#: flood's own handshakes took half again as much CPU on a busy machine, where
#: the test runs longer and the flood with it).
REOPEN_S = 0.5


async def hold_silent(port: int, source: str,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """One silent socket against ``port``, opened again whenever it is closed."""
    started = False
    while True:
        sock = trio.socket.socket()
        try:
            await sock.bind((source, 0))
            await sock.connect(("127.0.0.1", port))
            stream = trio.SocketStream(sock)
            if not started:
                started = True
                task_status.started()
            while await stream.receive_some(1024):
                pass
        except OSError:
            pass
        finally:
            sock.close()
        await trio.sleep(REOPEN_S)


async def hold_key(port: int, key: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """One connection of a fresh key against ``port``, dialled again when it ends."""
    started = False
    while True:
        try:
            connection = await dial_tcp("127.0.0.1", port, KeyPair.generate(),
                                        bytes.fromhex(key))
        except Exception:  # refused mid-handshake (evicted): try again
            connection = None
        if not started:
            started = True
            task_status.started()
        if connection is not None:
            async with trio.open_nursery() as nursery:
                await nursery.start(connection.run)
                await connection.mux.wait_closed()
                nursery.cancel_scope.cancel()
        await trio.sleep(REOPEN_S)


async def flood(nursery: trio.Nursery, port: int, key: str, *, keys: int = KEYS,
                silent: int = SILENT) -> None:
    """``keys`` connections of fresh keys and ``silent`` silent sockets (from
    several loopback addresses) against ``port``, held on to."""
    for _ in range(keys):
        await nursery.start(hold_key, port, key)
    for n in range(silent):
        await nursery.start(hold_silent, port, f"127.0.0.{1 + n % 5}")


async def admitted(host: PeerHost, port: int, keypair: KeyPair,
                   timeout_s: float = 20.0) -> bool:
    """Dial ``host`` (listening on ``port``) as ``keypair``: True once the host
    holds the connection in a slot, False if it closed it instead (refused).
    The connection is closed again either way."""
    connection = await dial_tcp("127.0.0.1", port, keypair, host.public_key)
    result = False
    with trio.fail_after(timeout_s):
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.run)

            async def taken() -> None:
                nonlocal result
                await wait_until(lambda: keypair.public_key in host.connections)
                result = True
                nursery.cancel_scope.cancel()

            async def closed() -> None:
                await connection.mux.wait_closed()
                nursery.cancel_scope.cancel()

            nursery.start_soon(taken)
            nursery.start_soon(closed)
    await connection.aclose()
    return result
