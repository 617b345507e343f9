"""A long-lived client of wrk-ork's ``cosmicac-ork/1`` for the daemons that call it.

app-node sends every job, replica, rack and node operation to wrk-ork over the
swarm (DESIGN.md §4: no HTTP between daemons). :class:`OrkClient` keeps one
connection to wrk-ork's key for as long as the daemon runs
(:func:`p2p.swarm.stay_connected`: its known addresses first, then the DHT,
redialled with backoff), holds one RPC client on it, and lets any task call
through it: a call made while wrk-ork is unreachable waits for the connection
up to its timeout and then fails with :class:`OrkUnavailable`, which says
what to check. wrk-ork's own refusals keep their codes (:class:`RpcError`:
``NOT_FOUND``, ``INVALID_STATE``, ``BAD_REQUEST``, ``CONFLICT``,
``FORBIDDEN``...), so the caller maps them to its answer.

A call cut by a lost connection is not retried here: a create that may have
reached wrk-ork is the caller's to look up, not to send twice.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from p2p.connection import Address, Connection
from p2p.keys import format_key
from p2p.rpc import Method, RpcClient, StreamMethod
from p2p.swarm import Swarm, UpkeepPolicy, stay_connected

from .service import PROTOCOL

__all__ = ["OrkClient", "OrkUnavailable"]

log = logging.getLogger(__name__)

#: A call's default bound: waiting for the connection plus wrk-ork's answer.
DEFAULT_TIMEOUT_S = 15.0


class OrkUnavailable(Exception):
    """wrk-ork could not be reached within the call's timeout."""


class OrkClient:
    """Calls wrk-ork over a connection kept open (see the module doc).

    Args:
        swarm: the daemon's running swarm.
        ork: wrk-ork's public key.
        addresses: where it listens, tried before the DHT.
        backoff: the waits between failed dials.
    """

    def __init__(self, swarm: Swarm, ork: bytes, *, addresses: Iterable[Address] = (),
                 backoff: UpkeepPolicy = UpkeepPolicy()) -> None:
        self.swarm = swarm
        self.ork = ork
        self.addresses = tuple(addresses)
        self.backoff = backoff
        self._client: RpcClient | None = None
        self._connected = trio.Event()
        #: Connections made so far (tests and the status line).
        self.connections = 0

    @property
    def connected(self) -> bool:
        return self._client is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Keep the connection until cancelled; ``started`` at once (calls wait)."""
        await stay_connected(self.swarm, self.ork, addresses=self.addresses or None,
                             on_connection=self._hold, backoff=self.backoff,
                             task_status=task_status)

    async def _hold(self, connection: Connection) -> None:
        channel = await connection.open_channel(PROTOCOL)
        client = RpcClient(channel, name=f"ork-{format_key(self.ork)[:12]}")
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            self._client = client
            self.connections += 1
            self._connected.set()
            log.info("ork_client.connected ork=%s", format_key(self.ork)[:12])
            try:
                await trio.sleep_forever()
            finally:
                self._client = None
                self._connected = trio.Event()
                nursery.cancel_scope.cancel()
                log.info("ork_client.disconnected ork=%s", format_key(self.ork)[:12])

    async def _ready_client(self, deadline: float) -> RpcClient:
        while self._client is None:
            with trio.move_on_at(deadline):
                await self._connected.wait()
            if self._client is None and trio.current_time() >= deadline:
                raise OrkUnavailable(
                    f"wrk-ork ({format_key(self.ork)[:12]}) is not reachable: check that it "
                    "runs, that its key and addresses are right, and that it lists this "
                    "daemon's key in its clients")
        return self._client

    async def call(self, method: Method, params: Any, *,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
        """``method(params)`` on wrk-ork.

        Raises:
            OrkUnavailable: no connection within ``timeout_s``.
            RpcError: wrk-ork refused (its code), or the connection broke mid-call
                (``CHANNEL_CLOSED``: the call may or may not have been applied).
        """
        deadline = trio.current_time() + timeout_s
        client = await self._ready_client(deadline)
        remaining = max(0.001, deadline - trio.current_time())
        return await client.call(method, params, timeout_s=remaining)

    @asynccontextmanager
    async def stream(self, method: StreamMethod, params: Any, *,
                     connect_timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncIterator[Any]:
        """A server-streamed call (``jobs.watch``); it ends with the connection.

        Raises:
            OrkUnavailable: no connection within ``connect_timeout_s``.
        """
        client = await self._ready_client(trio.current_time() + connect_timeout_s)
        async with client.stream(method, params) as items:
            yield items


