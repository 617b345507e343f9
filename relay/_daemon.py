"""``run_relay``: the relay daemon's trio entry (TCP relay + DHT node + metrics).

The relay listens on one port number for both transports, as upstream's
blind-relay-service does: TCP for control and attach connections, UDP for
its DHT node. It keeps announcing its key under
``record_topic_for_key(relay_key)`` with its TCP address, so a peer that
knows only the relay's key (from ``interconnect.relays``) finds where to
connect with ``find_peer``. The DHT record's address port is the TCP port
because both sockets share the number.

Shutdown order matters: the announcer unannounces when cancelled, which needs
the DHT node still running. The node therefore runs in a shielded scope that
is cancelled only after everything else has stopped.
"""

from __future__ import annotations

import errno
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from p2p.dht import DhtError, DhtNode, UdpTransport, dht_registry, record_topic_for_key
from p2p.keys import KeyPair, format_key
from p2p.metrics import CollectorRegistry, combined_registry, serve_metrics
from p2p.net import Network, StreamListener

from ._config import DEFAULT_PORT, RelayConfig
from ._metrics import relay_registry
from ._server import Observer, RelayServer

__all__ = ["RelayAddresses", "bind_relay_sockets", "run_relay"]

log = logging.getLogger(__name__)

#: Tries to find a port free for both TCP and UDP when asked for port 0.
PORT_ZERO_TRIES = 20
#: Backoff between failed announce attempts (no address learned yet, no peers).
ANNOUNCE_RETRY_MIN_S = 1.0
ANNOUNCE_RETRY_MAX_S = 60.0
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class RelayAddresses:
    """Where a started relay can be reached."""

    #: TCP (host, port) the relay listens on (control and attach).
    tcp: tuple[str, int]
    #: UDP (host, port) of its DHT node (same port number).
    dht: tuple[str, int]
    #: (host, port) of the metrics endpoint, or None.
    metrics: tuple[str, int] | None
    #: The running server (counters, config).
    server: RelayServer
    #: The relay's and its DHT node's metrics, for the process's one endpoint
    #: (``daemon.metrics.add(addresses.registry)``).
    registry: CollectorRegistry


async def bind_relay_sockets(
    host: str, port: int
) -> tuple[list[trio.SocketListener], UdpTransport]:
    """Bind TCP and UDP on the same ``port`` (port 0: one number free for both).

    Raises:
        OSError: the address cannot be bound.
    """
    for attempt in range(PORT_ZERO_TRIES if port == 0 else 1):
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound_port = listeners[0].socket.getsockname()[1]
        try:
            transport = await UdpTransport.bind(host, bound_port, dual_stack=host == "::")
        except OSError as exc:
            for listener in listeners:
                await listener.aclose()
            if port != 0 or exc.errno != errno.EADDRINUSE or attempt == PORT_ZERO_TRIES - 1:
                raise
            continue
        return listeners, transport
    raise AssertionError("unreachable")  # pragma: no cover


async def _serve_network_listener(server: RelayServer, listener: StreamListener, *,
                                  task_status: trio.TaskStatus[None]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        task_status.started()
        while True:
            try:
                stream, address = await listener.accept()
            except trio.ClosedResourceError:
                return  # the host went down; the relay's other tasks run until cancelled
            nursery.start_soon(server.handle_stream, stream, address)


async def _keep_announced(node: DhtNode, keypair: KeyPair,
                          addresses: list[tuple[str, int]] | None) -> None:
    topic = record_topic_for_key(keypair.public_key)
    delay = ANNOUNCE_RETRY_MIN_S
    while True:
        try:
            # Runs until cancelled (refreshing); returns only by raising.
            await node.announce(topic, keypair, addresses=addresses)
        except DhtError as exc:
            log.debug("relay.announce_failed code=%s retry_s=%.0f", exc.code, delay)
        await trio.sleep(delay)
        delay = min(delay * 2, ANNOUNCE_RETRY_MAX_S)


async def run_relay(
    keypair: KeyPair,
    *,
    host: str = "0.0.0.0",
    port: int = DEFAULT_PORT,
    bootstrap: Iterable[tuple[str, int]] = (),
    config: RelayConfig | None = None,
    metrics_host: str = "127.0.0.1",
    metrics_port: int | None = None,
    observer: Observer | None = None,
    network: Network | None = None,
    task_status: trio.TaskStatus[RelayAddresses] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a relay until cancelled: TCP relay, DHT node, announcer, metrics.

    Args:
        keypair: the relay's identity (``load_or_create_keypair(storage)``).
        host, port: where to listen (TCP and UDP); port 0 picks a free one.
        bootstrap: DHT bootstrap nodes; none makes a standalone DHT node that
            others may bootstrap from.
        config: relay limits and timeouts.
        metrics_host, metrics_port: serve Prometheus metrics there (None: off;
            0: any free port). A daemon on :mod:`p2p.daemon` leaves this off and
            adds :attr:`RelayAddresses.registry` to its one endpoint instead.
        observer: see :class:`RelayServer` (tests).
        network: bind on this :class:`p2p.net.Network` (a ``MemoryInternet``
            host in tests) instead of the machine's sockets.

    Reports :class:`RelayAddresses` through ``task_status`` once listening.

    Raises:
        OSError: a port cannot be bound.
    """
    bootstrap = list(bootstrap)
    server = RelayServer(keypair, config, observer=observer)
    if network is None:
        listeners, transport = await bind_relay_sockets(host, port)
        tcp_address = listeners[0].socket.getsockname()[:2]
        serve = functools.partial(server.serve, listeners, address=tcp_address)
    else:
        listener = await network.listen_stream(host, port)
        listeners = [listener]
        tcp_address = listener.local_address
        try:
            transport = await network.bind_datagram(host, tcp_address[1])
        except BaseException:
            await trio.aclose_forcefully(listener)
            raise
        serve = functools.partial(_serve_network_listener, server, listener)
    # With no bootstrap the relay is the first node: nobody can probe it, and
    # the operator vouches for it (as `cosmicac dht bootstrap` does).
    node = DhtNode(transport, bootstrap=bootstrap, persistent=True, reachable=not bootstrap)
    node_scope = trio.CancelScope()

    async def run_node(*, task_status: trio.TaskStatus[None]) -> None:
        with node_scope:
            await node.run(task_status=task_status)

    try:
        async with trio.open_nursery() as outer:
            await outer.start(run_node)
            # From here on the node outlives a cancellation of run_relay until
            # the announcer has unannounced; the finally below then ends it.
            # (No checkpoint between the shield and the try.)
            node_scope.shield = True
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve)
                    registry = combined_registry(relay_registry(server), dht_registry(node))
                    metrics_address = None
                    if metrics_port is not None:
                        metrics_address = await nursery.start(functools.partial(
                            serve_metrics, registry, host=metrics_host, port=metrics_port,
                        ))
                    # A concrete --host is announced as given; on a wildcard the
                    # node names the address its peers observe (same port number).
                    announced = None if host in WILDCARD_HOSTS else [tcp_address]
                    nursery.start_soon(_keep_announced, node, keypair, announced)
                    log.info(
                        "relay.started key=%s tcp=%s:%d dht=%s:%d bootstrap=%d metrics=%s",
                        format_key(keypair.public_key), tcp_address[0], tcp_address[1],
                        *transport.local_address, len(bootstrap),
                        f"{metrics_address[0]}:{metrics_address[1]}" if metrics_address
                        else "off",
                    )
                    task_status.started(RelayAddresses(
                        tcp=tcp_address, dht=transport.local_address,
                        metrics=metrics_address, server=server, registry=registry,
                    ))
            finally:
                node_scope.shield = False
                node_scope.cancel()
                log.info("relay.stopped key=%s", format_key(keypair.public_key))
    finally:
        # serve_listeners closes them too; this covers a failure before it ran.
        for listener in listeners:
            await trio.aclose_forcefully(listener)
