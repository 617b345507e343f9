"""``cosmicac beam``: pipe stdin/stdout through a secret stream (hyperbeam-style).

The listener prints ``listening on <host>:<port> key <hex>`` on stderr and pipes
the first peer that completes a handshake; the dialer pins that key, so it
reaches exactly that listener or fails. stdout carries only the data.
"""

from __future__ import annotations

import functools
import logging
import socket
from pathlib import Path

import trio
import typer

from p2p.dht import DhtNode, UdpTransport, record_topic_for_key
from p2p.errors import ConnectionBroken, HandshakeError, KeyFormatError, P2PError
from p2p.keys import KeyPair, format_key, load_or_create_keypair, parse_public_key
from p2p.noise import SecretStream

from ._args import parse_peer
from ._console import err, fail
from ._stdio import StdinSource, StdoutSink
from .dht import parse_bootstrap

log = logging.getLogger(__name__)

__all__ = ["beam", "connect_failure_reason"]


def beam(
    key: str | None = typer.Argument(
        None, help="The listener's public key (64 hex characters); omit with --listen."
    ),
    listen: bool = typer.Option(False, "--listen", "-l", help="Wait for one peer instead."),
    address: str | None = typer.Option(
        None, "--address", "-a", help="HOST:PORT of the listener (dialer only)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(0, "--port", "-p", help="Port to listen on (0: any free port)."),
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
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line on stderr."),
) -> None:
    """Pipe stdin/stdout to a peer over an encrypted, key-pinned stream."""
    dht_bootstrap = parse_bootstrap(bootstrap) if bootstrap else []
    try:
        keypair = load_or_create_keypair(storage) if storage else KeyPair.generate()
    except P2PError as exc:
        fail(str(exc))
    if listen:
        if key is not None or address is not None:
            fail("--listen takes neither a KEY nor --address", code=2)
        trio.run(_listen, keypair, host, port, quiet, dht_bootstrap)
        return
    if key is None:
        fail("give the listener's KEY, or --listen to wait for a peer", code=2)
    if address is None:
        if not dht_bootstrap:
            fail("give --address HOST:PORT, or --bootstrap to find the listener by key",
                 code=2)
        try:
            remote_key = parse_public_key(key, what="listener key")
        except KeyFormatError as exc:
            fail(str(exc), code=2)
        trio.run(_dial_by_key, keypair, remote_key, dht_bootstrap, quiet)
        return
    remote_key, target = parse_peer(key, address, what="listener key")
    trio.run(_dial, keypair, remote_key, target, quiet)


async def _listen(
    keypair: KeyPair, host: str, port: int, quiet: bool, bootstrap: list[tuple[str, int]]
) -> None:
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    bound_port = listeners[0].socket.getsockname()[1]
    listener = listeners[0]
    for extra in listeners[1:]:
        await extra.aclose()
    async with listener:
        if not bootstrap:
            err.print(f"listening on {host}:{bound_port} key {keypair.hex}", markup=False)
            stream = await _accept_one(listener, keypair)
        else:
            stream = await _accept_while_announced(
                listener, keypair, (host, bound_port), bootstrap
            )
    await _pipe(stream, quiet)


async def _accept_one(listener: trio.SocketListener, keypair: KeyPair) -> SecretStream:
    while True:
        raw = await listener.accept()
        try:
            return await SecretStream.responder(raw, keypair)
        except HandshakeError as exc:
            # A scanner or a stale client must not consume the beam.
            err.print(f"beam: refused a connection: {exc}", markup=False)


async def _accept_while_announced(listener, keypair, address, bootstrap) -> SecretStream:
    """Announce our key on the DHT until the first peer arrives, then unannounce."""
    node = DhtNode(await UdpTransport.bind(address[0]), bootstrap=bootstrap)
    async with trio.open_nursery() as outer:
        await outer.start(node.run)
        async with trio.open_nursery() as announcing:
            stored = await announcing.start(functools.partial(
                node.announce, record_topic_for_key(keypair.public_key), keypair,
                addresses=[address],
            ))
            err.print(f"listening on {address[0]}:{address[1]} key {keypair.hex} "
                      f"(announced on {stored} DHT nodes)", markup=False)
            stream = await _accept_one(listener, keypair)
            announcing.cancel_scope.cancel()  # the announcer unannounces on its way out
        outer.cancel_scope.cancel()
    return stream


async def _dial_by_key(
    keypair: KeyPair, remote_key: bytes, bootstrap: list[tuple[str, int]], quiet: bool
) -> None:
    # A client: any local address of the bootstrap's family will do.
    wildcard = "::" if ":" in bootstrap[0][0] else "0.0.0.0"
    node = DhtNode(await UdpTransport.bind(wildcard), bootstrap=bootstrap)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        record = await node.find_peer(remote_key)
        nursery.cancel_scope.cancel()
    if record is None:
        fail(f"no listener with key {format_key(remote_key)} is announced on the DHT")
    failures = []
    for host, port in record.addresses:
        try:
            stream = await _connect(keypair, remote_key, (host, port))
        except OSError as exc:
            failures.append(f"{host}:{port} ({connect_failure_reason(exc)})")
            continue
        await _pipe(stream, quiet)
        return
    fail("cannot reach the listener at any announced address: " + ", ".join(failures))


async def _dial(
    keypair: KeyPair, remote_key: bytes, target: tuple[str, int], quiet: bool
) -> None:
    try:
        stream = await _connect(keypair, remote_key, target)
    except OSError as exc:
        fail(f"cannot connect to {target[0]}:{target[1]}: {connect_failure_reason(exc)}")
    await _pipe(stream, quiet)


async def _connect(
    keypair: KeyPair, remote_key: bytes, target: tuple[str, int]
) -> SecretStream:
    """TCP connect and handshake; a failed handshake exits with its reason.

    Raises:
        OSError: the TCP connection could not be made.
    """
    host, port = target
    raw = await trio.open_tcp_stream(host, port)
    try:
        return await SecretStream.initiator(raw, keypair, remote_key)
    except HandshakeError as exc:
        fail(f"handshake with {host}:{port} failed: {exc}")


def connect_failure_reason(exc: OSError) -> str:
    """Name the cause of a failed connect; trio groups one error per address tried."""
    causes = getattr(exc.__cause__, "exceptions", None) or [exc]
    if any(isinstance(cause, ConnectionRefusedError) for cause in causes):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    first = causes[0]
    return getattr(first, "strerror", None) or str(first)


async def _pipe(stream: SecretStream, quiet: bool) -> None:
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
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.keep_alive)
            async with trio.open_nursery() as directions:
                directions.start_soon(upload)
                directions.start_soon(download)
            nursery.cancel_scope.cancel()
    except* ConnectionBroken as group:
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
