"""Operator actions on a replica: add or remove a writer (``cosmicac db add-writer|remove-writer``).

With a daemon running on the storage folder (its status file says where it
listens), the request goes to it over an ordinary connection, signed with the
replica's own identity (only whoever can read the storage folder can sign
it); with none, the replica is opened and changed directly.

A daemon that embeds its replica keeps the database in a subfolder next to
its identity (app-node: identity in ``<storage>``, database in
``<storage>/db``): ``identity`` names that folder. ``require_daemon`` is for
callers that must not open the replica themselves (``cosmicac
autobase-connect``: the daemon owns the files, and may be about to start).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import trio

from p2p.connection import dial_tcp
from p2p.errors import P2PError
from p2p.keys import KeyPair, load_keypair
from p2p.rpc import RpcClient, RpcError

from ._base import Base
from ._errors import CrdtError, WriteRefused
from ._inspect import read_daemon_status
from ._messages import ADMIN, PROTOCOL, AdminParams, admin_message
from ._storage import Layout

__all__ = ["OperatorResult", "change_writer"]

#: How long the daemon may take to answer (it appends one durable entry).
ADMIN_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class OperatorResult:
    status: str  # added | already | removed
    length: int | None  # for a removal: the writer's entries that go on counting
    via: str  # "daemon pid N" or "storage" (no daemon was running)


async def change_writer(storage: str | os.PathLike[str], action: str, writer: bytes, *,
                        admin: bool = False, identity: str | os.PathLike[str] | None = None,
                        require_daemon: bool = False) -> OperatorResult:
    """Add (``add_writer``) or remove (``remove_writer``) ``writer`` as the replica in ``storage``.

    ``identity``: the folder of the replica's identity, if not ``storage``.
    ``require_daemon``: never open the replica here; without a daemon
    running on it, raise ``DAEMON_NOT_RUNNING``.

    Raises:
        WriteRefused: the replica refused (``NOT_AN_ADMIN``, ``REMOVED``,
            ``UNKNOWN_WRITER``, ``NOT_ALLOWED``...).
        CrdtError: no database (``NO_DATABASE``) or identity (``NO_IDENTITY``),
            the daemon could not be reached (``DAEMON_UNREACHABLE``), or none
            runs and ``require_daemon`` (``DAEMON_NOT_RUNNING``).
        LogInUse: a daemon holds the replica but left no status file.
    """
    identity = storage if identity is None else identity
    try:
        keypair = load_keypair(identity)
    except Exception as exc:  # IdentityError and OSError alike: name the folder
        raise CrdtError(f"no usable identity in {identity}: {exc}", code="NO_IDENTITY") from None
    bootstrap = Layout.of(storage).read_bootstrap()  # never create a database by accident
    daemon = read_daemon_status(storage)
    if daemon is None or "address" not in daemon:
        if require_daemon:
            raise CrdtError(f"no daemon is running on {storage} (no fresh "
                            f"{Layout.of(storage).status})", code="DAEMON_NOT_RUNNING")

        def offline() -> OperatorResult:
            with Base.open(storage, keypair, bootstrap=bootstrap) as base:
                change = base.change_writer(action, writer, admin=admin)
            return OperatorResult(change.status, change.length, "storage")

        return await trio.to_thread.run_sync(offline)
    host, port = daemon["address"]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return await _ask_daemon(keypair, keypair.public_key, Path(storage), (host, int(port)),
                             daemon["pid"], action, writer, admin)


async def _ask_daemon(signer: KeyPair, daemon_key: bytes, storage: Path,
                      address: tuple[str, int], pid: int, action: str, writer: bytes,
                      admin: bool) -> OperatorResult:
    """Send the request to the daemon ``daemon_key`` at ``address``, signed by ``signer``."""
    db = Layout.of(storage).read_bootstrap()
    caller = KeyPair.generate()  # the daemon's swarm refuses its own key as a peer
    params = AdminParams(db=db, action=action, writer=writer, admin=admin,
                         signature=signer.sign(admin_message(db, caller.public_key, action,
                                                             writer, admin)))
    try:
        with trio.fail_after(ADMIN_TIMEOUT_S):
            connection = await dial_tcp(*address, caller, daemon_key)
            async with trio.open_nursery() as nursery:
                await nursery.start(connection.run)
                channel = await connection.open_channel(PROTOCOL, secrets.token_bytes(8))
                client = RpcClient(channel, name="db-admin")
                await nursery.start(client.run)
                try:
                    result = await client.call(ADMIN, params, timeout_s=ADMIN_TIMEOUT_S)
                finally:
                    nursery.cancel_scope.cancel()
    except* RpcError as group:
        exc = group.exceptions[0]
        raise WriteRefused(exc.message, code=exc.code) from None
    except* (OSError, trio.TooSlowError, trio.BrokenResourceError, P2PError) as group:
        raise CrdtError(f"the daemon (pid {pid}) at {address[0]}:{address[1]} could not be "
                        f"reached: {group.exceptions[0]!r}", code="DAEMON_UNREACHABLE") from None
    return OperatorResult(result.status, result.length, f"daemon pid {pid}")
