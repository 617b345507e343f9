"""A long-lived RPC client of one daemon, for the daemons that call it.

app-node calls wrk-ork (:class:`nodes.kit.ork_client.OrkClient`) and wrk-monitor
(:class:`nodes.kit.monitor_client.MonitorClient`) over the swarm (DESIGN.md §4: no
HTTP between daemons). :class:`PeerClient` keeps one connection to the peer's
key for as long as the daemon runs (:func:`p2p.swarm.stay_connected`: its known
addresses first, then the DHT, redialled with backoff), holds one RPC client on
it, and lets any task call through it. A call made while the peer is
unreachable waits for the connection up to its timeout, then fails with the
subclass's ``unavailable`` error, which says what to check; the peer's own
refusals keep their codes (:class:`~p2p.rpc.RpcError`).

A call cut by a lost connection is not retried here: a create that may have
reached the peer is the caller's to look up, not to send twice.

Each time the connection comes up, :meth:`PeerClient.on_connected` runs in a
task of its own (cancelled when the connection goes); subclasses override it
to tell the peer something it must know on every connection (app-node's
:class:`~nodes.kit.monitor_client.MonitorClient` sends its Loki and Prometheus
URLs). What it raises is logged, never fatal: the next connection runs it again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import trio

from contracts.health import STATUS, ServiceStatus, StatusRequest
from p2p.connection import Address, Connection
from p2p.keys import format_key
from p2p.rpc import Method, RpcClient, StreamMethod
from p2p.swarm import Swarm, UpkeepPolicy, stay_connected

__all__ = ["PeerClient"]

log = logging.getLogger(__name__)


class PeerClient:
    """Calls one daemon over a connection kept open (see the module doc).

    Subclasses name the peer (``peer``, e.g. ``wrk-ork``), its ``protocol``,
    the error raised when it cannot be reached and what to check then (``hint``),
    and, when another part of the same daemon opens the same protocol to the
    same peer (app-node reads from and ships logs to wrk-monitor), a
    ``channel_id`` of its own: a mux keeps one channel per (protocol, id).

    Args:
        swarm: the daemon's running swarm.
        key: the peer's public key.
        addresses: where it listens, tried before the DHT.
        backoff: the waits between failed dials.
        timeout_s: a call's default bound (waiting for the connection plus the
            answer); default: the subclass's ``default_timeout_s``.
    """

    peer: ClassVar[str]
    protocol: ClassVar[str]
    unavailable: ClassVar[type[Exception]]
    hint: ClassVar[str]
    default_timeout_s: ClassVar[float] = 15.0
    channel_id: ClassVar[bytes] = b""

    def __init__(self, swarm: Swarm, key: bytes, *, addresses: Iterable[Address] = (),
                 backoff: UpkeepPolicy = UpkeepPolicy(), timeout_s: float | None = None) -> None:
        self.swarm = swarm
        self.key = key
        self.addresses = tuple(addresses)
        self.backoff = backoff
        self.timeout_s = self.default_timeout_s if timeout_s is None else timeout_s
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
        await stay_connected(self.swarm, self.key, addresses=self.addresses or None,
                             on_connection=self._hold, backoff=self.backoff,
                             task_status=task_status)

    async def _hold(self, connection: Connection) -> None:
        label = format_key(self.key)[:12]
        channel = await connection.open_channel(self.protocol, self.channel_id)
        client = RpcClient(channel, name=f"{self.peer}-{label}")
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            self._client = client
            self.connections += 1
            self._connected.set()
            log.info("peer_client.connected peer=%s key=%s", self.peer, label)
            nursery.start_soon(self._run_on_connected, client, label)
            try:
                await trio.sleep_forever()
            finally:
                self._client = None
                self._connected = trio.Event()
                nursery.cancel_scope.cancel()
                log.info("peer_client.disconnected peer=%s key=%s", self.peer, label)

    async def on_connected(self, client: RpcClient) -> None:
        """Called in its own task each time the connection comes up; nothing by default.

        Args:
            client: the RPC client on the new connection (calls may be made on
                it at once; the task is cancelled when the connection goes).
        """

    async def _run_on_connected(self, client: RpcClient, label: str) -> None:
        try:
            await self.on_connected(client)
        except Exception as exc:  # a hook's failure never costs the connection
            log.warning("peer_client.on_connected_failed peer=%s key=%s error=%s: %s",
                        self.peer, label, type(exc).__name__, exc)

    async def ready(self, timeout_s: float | None = None) -> RpcClient:
        """The RPC client once connected.

        Raises:
            unavailable: no connection within ``timeout_s`` (default: the client's).
        """
        deadline = trio.current_time() + (self.timeout_s if timeout_s is None else timeout_s)
        while self._client is None:
            with trio.move_on_at(deadline):
                await self._connected.wait()
            if self._client is None and trio.current_time() >= deadline:
                raise self.unavailable(
                    f"{self.peer} ({format_key(self.key)[:12]}) is not reachable: check that "
                    f"it runs, that its key and addresses are right, and {self.hint}")
        return self._client

    async def call(self, method: Method, params: Any, *,
                   timeout_s: float | None = None) -> Any:
        """``method(params)`` on the peer.

        Raises:
            unavailable: no connection within ``timeout_s``.
            RpcError: the peer refused (its code), or the connection broke mid-call
                (``CHANNEL_CLOSED``: the call may or may not have been applied).
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = trio.current_time() + timeout_s
        client = await self.ready(timeout_s)
        remaining = max(0.001, deadline - trio.current_time())
        return await client.call(method, params, timeout_s=remaining)

    async def status(self, *, timeout_s: float | None = None) -> ServiceStatus:
        """The peer's ``service.status`` (:mod:`contracts.health`): every daemon
        app-node watches answers it on its own protocol.

        Raises:
            unavailable: no connection within ``timeout_s``.
            RpcError: as :meth:`call` (``UNKNOWN_METHOD``: a peer too old to answer it).
        """
        return await self.call(STATUS, StatusRequest(), timeout_s=timeout_s)

    @asynccontextmanager
    async def stream(self, method: StreamMethod, params: Any, *,
                     connect_timeout_s: float | None = None) -> AsyncIterator[Any]:
        """A server-streamed call; it ends with the connection.

        Raises:
            unavailable: no connection within ``connect_timeout_s``.
        """
        client = await self.ready(connect_timeout_s)
        async with client.stream(method, params) as items:
            yield items
