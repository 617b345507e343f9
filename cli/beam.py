"""``cosmicac beam``: pipe stdin/stdout to a peer over an encrypted, key-pinned link.

The listener prints ``listening on <host>:<port> key <hex>`` on stderr and pipes
the first peer that opens a beam channel; the dialer pins that key, so it
reaches exactly that listener or fails. stdout carries only the data.

Three ways to meet: ``--address`` (the dialer names the listener's TCP address),
``--bootstrap`` (the listener announces its key on the DHT through a swarm,
the dialer finds it by key alone), or ``--lan`` (both beacon on the LAN's
multicast group, p2p.lan: no DHT needed). With ``--relay KEY`` the listener also keeps
reservations with those blind relays and lists them in its record, so a dialer
that cannot reach it directly comes through a relay. Either way the bytes flow
over one mux channel, ``beam/1``, of an ordinary connection.
"""

from __future__ import annotations

import functools
import logging
import socket
from pathlib import Path

import trio
import typer

from p2p.connection import Connection, dial_tcp
from p2p.errors import ConnectionBroken, HandshakeError, P2PError
from p2p.host import ChannelService, serve_tcp
from p2p.keys import KeyPair, format_key, load_or_create_keypair
from p2p.lan import LanConfig
from p2p.mux import Channel, ChannelRejected, MuxError
from p2p.swarm import PeerNotFound, Swarm, SwarmConfig, SwarmError

from ._args import parse_key, parse_keys, parse_peer, port_option, wildcard_for
from ._console import err, fail, run_trio
from ._stdio import StdinSource, StdoutSink
from .dht import parse_bootstrap

log = logging.getLogger(__name__)

__all__ = ["beam", "connect_failure_reason", "report_path"]

PROTOCOL = "beam/1"
#: How long a connected peer has to open its beam channel.
CHANNEL_WAIT_S = 10.0


def beam(
    key: str | None = typer.Argument(
        None, help="The listener's public key (64 hex characters); omit with --listen."
    ),
    listen: bool = typer.Option(False, "--listen", "-l", help="Wait for one peer instead."),
    address: str | None = typer.Option(
        None, "--address", "-a", help="HOST:PORT of the listener (dialer only)."
    ),
    host: str | None = typer.Option(
        None, "--host", help="Address to listen on [default: 127.0.0.1, or 0.0.0.0 "
        "with --bootstrap]."
    ),
    port: int = port_option(0, "--port", "-p", help="Port to listen on (0: any free port)."),
    storage: Path | None = typer.Option(
        None, "--storage", envvar="COSMICAC_STORAGE",
        help="Keep the identity here (the same folder gives the same key); "
        "without it a fresh key is used for this run.",
    ),
    bootstrap: str | None = typer.Option(
        None, "--bootstrap", "-b", envvar="COSMICAC_DHT_BOOTSTRAP",
        help="DHT bootstrap HOST:PORT[,...]: the listener announces its key there, "
        "and a dialer without --address finds the listener by key.",
    ),
    relay: str | None = typer.Option(
        None, "--relay", "-r", envvar="COSMICAC_RELAYS",
        help="Blind relay keys KEY[,KEY...] (listener, with --bootstrap): keep "
        "reservations there so peers that cannot reach us directly come through them.",
    ),
    lan: bool = typer.Option(
        False, "--lan", help="Find each other on this LAN by signed multicast beacons "
        "(no DHT needed); beacons reach every host of the segment."),
    punch: bool = typer.Option(
        True, "--punch/--no-punch", help="When the peer is reached through a relay, move "
        "the beam to a direct path if a hole punch gets through both NATs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line on stderr."),
) -> None:
    """Pipe stdin/stdout to a peer over an encrypted, key-pinned stream.

    Example: cosmicac beam --listen < backup.tar   (prints the key to give the other side)

    Example: cosmicac beam 9f2c...e1 > backup.tar
    """
    dht_bootstrap = parse_bootstrap(bootstrap) if bootstrap else []
    lan_config = LanConfig() if lan else None
    relays = parse_keys(relay, what="relay key") if relay else []
    punching = {} if punch else {"hole_punching": None}
    if relays and not (listen and dht_bootstrap):
        fail("--relay is for a listener with --bootstrap (dialers learn relays from the DHT)",
             code=2)
    try:
        keypair = load_or_create_keypair(storage) if storage else KeyPair.generate()
    except P2PError as exc:
        fail(str(exc))
    if listen:
        if key is not None or address is not None:
            fail("--listen takes neither a KEY nor --address", code=2)
        if dht_bootstrap or lan:
            config = SwarmConfig(host=host or (wildcard_for(dht_bootstrap) if dht_bootstrap
                                               else "0.0.0.0"), port=port,
                                 bootstrap=tuple(dht_bootstrap), relays=tuple(relays),
                                 lan=lan_config, **punching)
            run_trio(_listen_on_swarm, keypair, config, quiet)
        else:
            run_trio(_listen, keypair, host or "127.0.0.1", port, quiet)
        return
    if key is None:
        fail("give the listener's KEY, or --listen to wait for a peer", code=2)
    if address is None:
        if not dht_bootstrap and not lan:
            fail("give --address HOST:PORT, or --bootstrap or --lan to find the listener "
                 "by key", code=2)
        remote_key = parse_key(key, what="listener key")
        config = SwarmConfig(host=host or (wildcard_for(dht_bootstrap) if dht_bootstrap
                                           else "0.0.0.0"),
                             bootstrap=tuple(dht_bootstrap), announce_key=False,
                             lan=lan_config, **punching)
        run_trio(_dial_by_key, keypair, remote_key, config, quiet)
        return
    remote_key, target = parse_peer(key, address, what="listener key")
    run_trio(_dial, keypair, remote_key, target, quiet)


# -- listening ---------------------------------------------------------------------


class BeamService(ChannelService):
    """Pipes the first beam a peer opens to stdin/stdout; turns later ones away.

    A peer that connects and opens no beam within ``CHANNEL_WAIT_S`` is
    dropped, so a scanner or a stale client cannot hold the beam."""

    def __init__(self, quiet: bool) -> None:
        super().__init__(PROTOCOL, self._beam, on_connection=self._watch)
        self.quiet = quiet
        self.done = trio.Event()
        self.finished = False
        self._taken = False
        self._beamers: set[bytes] = set()
        #: The connection the beam ran on.
        self.connection: Connection | None = None

    async def _beam(self, channel: Channel, connection: Connection) -> None:
        self._beamers.add(connection.remote_public_key)
        if self._taken:  # one beam per run: a second dialer is turned away
            return
        self._taken = True
        self.connection = connection
        try:
            async with trio.open_nursery() as nursery:
                if not self.quiet:
                    nursery.start_soon(report_path, connection)
                await _pipe(channel, self.quiet)
                nursery.cancel_scope.cancel()
            self.finished = True
        finally:
            self.done.set()

    async def _watch(self, connection: Connection) -> None:
        await trio.sleep(CHANNEL_WAIT_S)
        if connection.remote_public_key not in self._beamers:
            err.print("beam: a peer connected but opened no beam; waiting for another",
                      markup=False)
            await connection.aclose()


async def _listen(keypair: KeyPair, host: str, port: int, quiet: bool) -> None:
    beam = BeamService(quiet)
    async with trio.open_nursery() as nursery:
        try:
            bound_host, bound_port = await nursery.start(functools.partial(
                serve_tcp, keypair, services=[beam], host=host, port=port))
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        err.print(f"listening on {bound_host}:{bound_port} key {keypair.hex}", markup=False)
        await beam.done.wait()
        await _let_the_peer_close(beam)
        nursery.cancel_scope.cancel()
    if not beam.finished:
        fail("the connection ended before the beam finished")


async def _listen_on_swarm(keypair: KeyPair, config: SwarmConfig, quiet: bool) -> None:
    beam = BeamService(quiet)
    swarm = Swarm(keypair, config=config, services=[beam])
    async with trio.open_nursery() as nursery:
        try:
            host, port = await nursery.start(swarm.run)
        except OSError as exc:
            fail(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}")
        relays = f"; relays {len(config.relays)}" if config.relays else ""
        where = " and ".join(w for w, on in (("on the DHT", config.bootstrap),
                                             ("on the LAN", config.lan)) if on)
        err.print(f"listening on {host}:{port} key {keypair.hex} (announced {where}"
                  f"{relays})", markup=False)
        if config.relays:
            nursery.start_soon(_report_reservations, swarm)
        await beam.done.wait()
        await _let_the_peer_close(beam)
        nursery.cancel_scope.cancel()  # the swarm unannounces on its way out
    if not beam.finished:
        fail("the connection ended before the beam finished")


#: How long a listener whose beam ended waits for the dialler to close the connection.
CLOSE_WAIT_S = 2.0


async def _let_the_peer_close(beam: BeamService) -> None:
    """Wait (bounded) for the dialler to close: it closes once it has read our end of
    the beam, and a listener that tore the connection down first could reset it
    while our last bytes were still on their way."""
    if beam.connection is not None:
        with trio.move_on_after(CLOSE_WAIT_S):
            await beam.connection.wait_closed()


async def _report_reservations(swarm: Swarm) -> None:
    """Tell the operator when each relay holds (or lost) our reservation."""
    reported: set[bytes] = set()
    while True:
        await swarm.reservations_changed.wait()
        now = set(swarm.reserved_relays)
        for relay_key in now - reported:
            err.print(f"reserved on relay {format_key(relay_key)}", markup=False)
        for relay_key in reported - now:
            err.print(f"lost the reservation on relay {format_key(relay_key)}; retrying",
                      markup=False)
        reported = now


# -- dialling ----------------------------------------------------------------------

#: How long a dialler with --lan waits for the listener's beacon (it asks at start:
#: a listener there answers in a round trip).
LAN_WAIT_S = 5.0


async def _heard_on_lan(swarm: Swarm, remote_key: bytes) -> None:
    """Wait, at most LAN_WAIT_S, until ``remote_key``'s beacon was heard."""
    assert swarm.lan is not None
    with trio.move_on_after(LAN_WAIT_S):
        while not swarm.lan.book.addresses(remote_key, trio.current_time()):
            await swarm.lan.heard.wait()


async def _dial_by_key(
    keypair: KeyPair, remote_key: bytes, config: SwarmConfig, quiet: bool
) -> None:
    swarm = Swarm(keypair, config=config)
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(swarm.run)
        except OSError as exc:
            fail(f"cannot open a local socket: {exc.strerror or exc}")
        if swarm.lan is not None:
            await _heard_on_lan(swarm, remote_key)
        try:
            connection = await swarm.connect(remote_key)
        except PeerNotFound as exc:
            if swarm.lan is not None and not config.bootstrap:
                fail(f"no listener with key {format_key(remote_key)} answered on the LAN "
                     f"within {LAN_WAIT_S:g} s")
            fail(f"no listener with key {format_key(remote_key)} is announced on the DHT"
                 + (f" ({exc})" if exc.code == "DHT_UNREACHABLE" else ""))
        except SwarmError as exc:
            fail(f"cannot reach the listener: {exc}")
        if not quiet:
            nursery.start_soon(report_path, connection)
        await _open_and_pipe(connection, quiet)
        nursery.cancel_scope.cancel()


async def report_path(connection: Connection) -> None:
    """Say on stderr how the bytes go: through a relay, then (if the hole punch
    works) on a direct path, or why they stay on the relay."""
    if not connection.relayed:
        return
    assert connection.relay_key is not None
    err.print(f"beam: connected through relay {format_key(connection.relay_key)[:16]}…; "
              "trying a direct path", markup=False)
    # Bounded by the punch's own timeouts: it always settles with an outcome.
    while connection.path == "relayed" and connection.punch_outcome is None:
        await connection.wait_path_changed()
    if connection.path.startswith("punched"):
        took = trio.current_time() - connection.opened_at
        where = connection.remote_address
        to = f" to {where[0]}:{where[1]}" if where else ""
        how = "QUIC over UDP" if connection.path == "punched_udp" else "TCP"
        err.print(f"beam: moved to a direct path{to} ({how}) after {took:.2f} s",
                  markup=False)
    else:
        err.print(f"beam: staying on the relay ({connection.punch_outcome})", markup=False)


async def _dial(
    keypair: KeyPair, remote_key: bytes, target: tuple[str, int], quiet: bool
) -> None:
    host, port = target
    try:
        connection = await dial_tcp(host, port, keypair, remote_key)
    except OSError as exc:
        fail(f"cannot connect to {host}:{port}: {connect_failure_reason(exc)}")
    except HandshakeError as exc:
        fail(f"handshake with {host}:{port} failed: {exc}")
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        await _open_and_pipe(connection, quiet)
        nursery.cancel_scope.cancel()


async def _open_and_pipe(connection: Connection, quiet: bool) -> None:
    try:
        channel = await connection.open_channel(PROTOCOL)
    except ChannelRejected as exc:
        fail(f"the peer does not accept a beam: {exc}")
    except (MuxError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        fail(f"connection lost before the beam opened: {exc}")
    await _pipe(channel, quiet)
    await connection.aclose()


def connect_failure_reason(exc: OSError) -> str:
    """Name the cause of a failed connect; trio groups one error per address tried."""
    causes = getattr(exc.__cause__, "exceptions", None) or [exc]
    if any(isinstance(cause, ConnectionRefusedError) for cause in causes):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    first = causes[0]
    return getattr(first, "strerror", None) or str(first)


async def _pipe(channel: Channel, quiet: bool) -> None:
    stream = channel.as_stream()
    counts = {"sent": 0, "received": 0}
    stdin = StdinSource()
    stdout = StdoutSink()

    async def upload() -> None:
        while data := await stdin.receive_some():
            await stream.send_all(data)
            counts["sent"] += len(data)
        await stream.send_eof()

    async def download() -> None:
        while data := await stream.receive_some():
            await stdout.send_all(data)
            counts["received"] += len(data)
        await stdout.aclose()

    try:
        async with trio.open_nursery() as directions:
            directions.start_soon(upload)
            directions.start_soon(download)
    except* (ConnectionBroken, MuxError, trio.BrokenResourceError) as group:
        fail(f"connection lost: {group.exceptions[0]}")
    except* BrokenPipeError:
        fail("stdout was closed by its reader")
    finally:
        await stdin.aclose()
        await stdout.aclose()
        await stream.aclose()
    if not quiet:
        err.print(f"beam: sent {counts['sent']} bytes, received {counts['received']} bytes",
                  markup=False)
