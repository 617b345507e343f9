"""Starting a daemon's peer and its HTTP side: the shell every daemon shares.

A platform daemon is one peer (one identity, one swarm, its services added to
it) and, for some, an HTTP side beside it. :func:`start_peer` and
:func:`serve_http` are the one way to start them, so each ``daemon.py`` only
wires its own services::

    peer = await start_peer(daemon, keypair, settings, [queues, service],
                            reserved=lambda key: key in known)
    ...
    http_address = await nursery.start(serve_http, app, settings.http, "the API")

Failures the operator fixes are named once, here: a swarm port that cannot be
bound is a :class:`~p2p.daemon.DaemonError` (``cannot listen on H:P: …``); an
HTTP port is an :class:`HttpBindError` (``cannot serve the API on H:P: …``),
a :class:`~p2p.http.ServerBindError` that ``run_daemon`` prints as one line.

A daemon runs under ``cosmicac run`` (``run_daemon`` gives its start function
a :class:`~p2p.daemon.Daemon`) or in-process (tests, benchmarks: a
``serve_…`` function with a nursery of its own, which passes
:func:`in_process`). Both have what these functions need: a nursery, the
process's metrics (or None) and the network the sockets come from. A daemon
written as a ``serve_…`` function runs under ``cosmicac run`` through
:func:`start_served`.

Falls short: the swarm's bind error is a ``DaemonError`` in-process too, where
an ``OSError`` subclass naming the address (as the HTTP side's) would let a
test tell a busy port from other failures without reading the message.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

import trio

from p2p.daemon import Daemon, DaemonError, ProcessMetrics
from p2p.host import Reserved
from p2p.http import ServerBindError, serve_asgi
from p2p.keys import KeyPair
from p2p.lan import LanConfig
from p2p.net import Network
from p2p.swarm import Swarm, SwarmConfig

from .settings import PeerSettings

__all__ = ["DaemonHost", "HttpAddress", "HttpBindError", "RunningDaemon", "RunningPeer",
           "in_process", "known_peers", "serve_http", "start_peer", "start_served"]


class DaemonHost(Protocol):
    """Where a daemon's parts run (the kit's :class:`~p2p.daemon.Daemon` is one)."""

    @property
    def nursery(self) -> trio.Nursery: ...

    @property
    def metrics(self) -> ProcessMetrics | None: ...

    @property
    def network(self) -> Network | None: ...


@dataclass(frozen=True)
class _Host:
    nursery: trio.Nursery
    metrics: ProcessMetrics | None = None
    network: Network | None = None


def in_process(nursery: trio.Nursery, metrics: ProcessMetrics | None = None,
               network: Network | None = None) -> DaemonHost:
    """A :class:`DaemonHost` for a daemon served in-process (``serve_proxy`` …).

    Args:
        nursery: where its tasks run.
        metrics: the process's endpoint (None: the registries are not shown).
        network: where its sockets come from (None: the host's own).
    """
    return _Host(nursery, metrics, network)


async def start_served(daemon: Daemon[Any], serve: Callable[..., Any], **kwargs: Any) -> Any:
    """Start a daemon written as a ``serve_…`` function under ``cosmicac run``.

    Calls ``serve(settings, metrics=daemon.metrics, network=daemon.network,
    **kwargs)`` in ``daemon.nursery``, its settings' ``storage`` the folder the
    kit locked, and returns what it reports once serving (its ``Running…``).
    A failure to start (a :class:`~p2p.daemon.DaemonError`, an
    :class:`HttpBindError`) comes out of the nurseries for ``run_daemon`` to
    print as one line.
    """
    settings = daemon.settings
    if daemon.storage is not None:
        settings = settings.model_copy(update={"storage": daemon.storage})
    return await daemon.nursery.start(functools.partial(
        serve, settings, metrics=daemon.metrics, network=daemon.network, **kwargs))


class RunningPeer(NamedTuple):
    """A daemon's swarm, serving, and the address it is bound to."""

    swarm: Swarm
    address: tuple[str, int]


async def start_peer(daemon: DaemonHost, keypair: KeyPair, settings: PeerSettings,
                     services: Iterable[object] = (), *, reserved: Reserved | None = None,
                     setup: Callable[[Swarm], object] | None = None,
                     **swarm_config: Any) -> RunningPeer:
    """Build the daemon's swarm from ``settings``, start it in ``daemon.nursery``.

    Args:
        daemon: its nursery, metrics and network.
        keypair: the daemon's identity.
        settings: ``host``, ``port``, ``bootstrap``, ``relays``, ``relay_addresses``,
            ``announce_addresses``.
        services: the protocols it serves (added before it listens, so the
            first connection finds them).
        reserved: the keys that keep connection slots under a flood of
            strangers (the daemon's callers and peers).
        setup: called with the swarm before it listens, for what needs the
            swarm itself (a firewall over a pool of its connections).
        swarm_config: more :class:`~p2p.swarm.SwarmConfig` fields, or a
            setting replaced (``stranger_evict_after_s=2.0``).

    Returns:
        The running swarm and its bound ``(host, port)``. Its registry is on
        ``daemon.metrics``; add hooks that need the running swarm afterwards.

    Raises:
        DaemonError: the port cannot be bound (``cannot listen on H:P: …``).
    """
    config = SwarmConfig(**{
        "host": settings.host, "port": settings.port, "bootstrap": settings.bootstrap,
        "relays": settings.relays, "announce_addresses": settings.announce_addresses,
        "known_peers": known_peers(settings.relay_addresses),
        "lan": LanConfig() if settings.lan_discovery else None,
        **({} if settings.hole_punching else {"hole_punching": None}), **swarm_config})
    swarm = Swarm(keypair, config=config, network=daemon.network, services=list(services))
    if reserved is not None:
        swarm.add_reserved(reserved)
    if setup is not None:
        setup(swarm)
    try:
        address = await daemon.nursery.start(swarm.run)
    except OSError as exc:
        raise DaemonError(f"cannot listen on {config.host}:{config.port}: "
                          f"{exc.strerror or exc}") from None
    if daemon.metrics is not None:
        daemon.metrics.add(swarm.metrics.registry)
    return RunningPeer(swarm, address)


@dataclass
class RunningDaemon:
    """A daemon with a peer and an HTTP side, serving in-process: where it is.

    Each daemon's ``Running…`` record (what its ``serve_…`` reports, for tests
    and benchmarks) extends it with the parts of its own.
    """

    #: The HTTP side's bound (host, port).
    http_address: tuple[str, int]
    #: The swarm's bound (host, port).
    swarm_address: tuple[str, int]
    swarm: Swarm
    #: Where its API lives on the HTTP side (``/api``, ``/v1``).
    url_path: ClassVar[str] = ""

    @property
    def url(self) -> str:
        """The API's base URL, ``http://host:port`` + :attr:`url_path`."""
        host, port = self.http_address
        return f"http://{host}:{port}{self.url_path}"


class HttpAddress(Protocol):
    """Where an HTTP side listens: an :class:`~nodes.kit.settings.HttpSettings`,
    or a daemon whose settings are only that (the entry point's)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


class HttpBindError(ServerBindError):
    """A daemon's HTTP side cannot listen on its address.

    ``str``: ``cannot serve <what> on H:P: <reason>`` (``what``: ``HTTP``,
    ``the API``…), the one line ``run_daemon`` prints before exit 1.
    """

    def __init__(self, host: str, port: int, cause: OSError, *, what: str = "HTTP") -> None:
        super().__init__(host, port, cause)
        self.what = what


async def serve_http(app: Any, settings: HttpAddress, what: str = "HTTP", *,
                     on_listening: Callable[[tuple[str, int]], None] | None = None,
                     lean: bool = False,
                     task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
                     ) -> None:
    """Serve the ASGI ``app`` on ``settings.host:settings.port`` until cancelled.

    Reports the bound ``(host, port)`` once listening (port 0 picks a free one).
    ``lean``: on :mod:`p2p.httpserver` (HTTP/1.1 only, no lifespan events)
    instead of hypercorn, for the hot APIs whose per-request cost users feel.

    Raises:
        HttpBindError: the address cannot be bound (raised bare, before
            anything is served), naming ``what`` is served there.
    """
    await serve_asgi(app, host=settings.host, port=settings.port,
                     bind_error=functools.partial(HttpBindError, what=what),
                     on_listening=on_listening, lean=lean, task_status=task_status)


def known_peers(addresses: Mapping[bytes, Iterable[tuple[str, int]]]
                ) -> tuple[tuple[bytes, tuple[tuple[str, int], ...]], ...]:
    """``relay_addresses`` as :class:`~p2p.swarm.SwarmConfig`'s ``known_peers``."""
    return tuple((key, tuple(where)) for key, where in addresses.items())
