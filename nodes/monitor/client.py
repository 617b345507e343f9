"""A long-lived client of wrk-monitor's ``cosmicac-monitor/1`` for daemons that read logs.

app-node reads a job's logs from wrk-monitor over the swarm (DESIGN.md §4: no
HTTP between daemons). :class:`MonitorClient` is shaped like
:class:`nodes.ork.client.OrkClient`: one connection to wrk-monitor's key kept for
as long as the daemon runs (:func:`p2p.swarm.stay_connected`: its known
addresses first, then the DHT, redialled with backoff), one RPC client on it,
and any task calls through it. A call made while wrk-monitor is unreachable
waits for the connection up to its timeout and then fails with
:class:`MonitorUnavailable`, which says what to check; wrk-monitor's refusals
keep their codes (:class:`~p2p.rpc.RpcError`: ``FORBIDDEN``, ``LAGGED``,
``TOO_MANY_FOLLOWERS``).

Why a copy of OrkClient's few lines and not a shared base: the two differ in
their error's words and protocol, and a base class in ``p2p`` for two users
would be an abstraction ahead of need.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from contracts.telemetry import PROTOCOL
from p2p.connection import Address, Connection
from p2p.keys import format_key
from p2p.rpc import Method, RpcClient, StreamMethod
from p2p.swarm import Swarm, UpkeepPolicy, stay_connected

__all__ = ["DEFAULT_TIMEOUT_S", "MonitorClient", "MonitorUnavailable"]

log = logging.getLogger(__name__)

#: A call's default bound: waiting for the connection plus wrk-monitor's answer.
DEFAULT_TIMEOUT_S = 10.0


class MonitorUnavailable(Exception):
    """wrk-monitor could not be reached within the call's timeout."""


class MonitorClient:
    """Calls wrk-monitor over a connection kept open (see the module doc).

    Args:
        swarm: the daemon's running swarm.
        monitor: wrk-monitor's public key.
        addresses: where it listens, tried before the DHT.
        backoff: the waits between failed dials.
        timeout_s: a call's default bound (a user waits on app-node meanwhile).
    """

    def __init__(self, swarm: Swarm, monitor: bytes, *, addresses: Iterable[Address] = (),
                 backoff: UpkeepPolicy = UpkeepPolicy(),
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.swarm = swarm
        self.monitor = monitor
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
        await stay_connected(self.swarm, self.monitor, addresses=self.addresses or None,
                             on_connection=self._hold, backoff=self.backoff,
                             task_status=task_status)

    async def _hold(self, connection: Connection) -> None:
        channel = await connection.open_channel(PROTOCOL)
        client = RpcClient(channel, name=f"monitor-{format_key(self.monitor)[:12]}")
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            self._client = client
            self.connections += 1
            self._connected.set()
            log.info("monitor_client.connected monitor=%s", format_key(self.monitor)[:12])
            try:
                await trio.sleep_forever()
            finally:
                self._client = None
                self._connected = trio.Event()
                nursery.cancel_scope.cancel()
                log.info("monitor_client.disconnected monitor=%s",
                         format_key(self.monitor)[:12])

    async def ready(self, timeout_s: float | None = None) -> RpcClient:
        """The RPC client once connected.

        Raises:
            MonitorUnavailable: no connection within ``timeout_s`` (default: the client's).
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = trio.current_time() + timeout_s
        while self._client is None:
            with trio.move_on_at(deadline):
                await self._connected.wait()
            if self._client is None and trio.current_time() >= deadline:
                raise MonitorUnavailable(
                    f"wrk-monitor ({format_key(self.monitor)[:12]}) is not reachable: check "
                    "that it runs, that its key and addresses are right in app-node's "
                    "settings, and that it lists this daemon's key in its followers")
        return self._client

    async def call(self, method: Method, params: Any, *,
                   timeout_s: float | None = None) -> Any:
        """``method(params)`` on wrk-monitor.

        Raises:
            MonitorUnavailable: no connection within ``timeout_s``.
            RpcError: wrk-monitor refused (its code), or the connection broke mid-call.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = trio.current_time() + timeout_s
        client = await self.ready(timeout_s)
        remaining = max(0.001, deadline - trio.current_time())
        return await client.call(method, params, timeout_s=remaining)

    @asynccontextmanager
    async def stream(self, method: StreamMethod, params: Any, *,
                     connect_timeout_s: float | None = None) -> AsyncIterator[Any]:
        """A server-streamed call (``logs.follow``); it ends with the connection.

        Raises:
            MonitorUnavailable: no connection within ``connect_timeout_s``.
        """
        client = await self.ready(connect_timeout_s)
        async with client.stream(method, params) as items:
            yield items
