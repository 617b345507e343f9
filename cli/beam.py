"""``cosmicac beam``: pipe stdin/stdout through a secret stream (hyperbeam-style).

The listener prints ``listening on <host>:<port> key <hex>`` on stderr and pipes
the first peer that completes a handshake; the dialer pins that key, so it
reaches exactly that listener or fails. stdout carries only the data.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import trio
import typer

from p2p.errors import ConnectionBroken, HandshakeError, P2PError
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.noise import SecretStream

from ._args import parse_peer
from ._console import err, fail
from ._stdio import StdinSource, StdoutSink

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
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line on stderr."),
) -> None:
    """Pipe stdin/stdout to a peer over an encrypted, key-pinned stream."""
    try:
        keypair = load_or_create_keypair(storage) if storage else KeyPair.generate()
    except P2PError as exc:
        fail(str(exc))
    if listen:
        if key is not None or address is not None:
            fail("--listen takes neither a KEY nor --address", code=2)
        trio.run(_listen, keypair, host, port, quiet)
        return
    if key is None:
        fail("give the listener's KEY, or --listen to wait for a peer", code=2)
    if address is None:
        fail("--address HOST:PORT is required to reach the listener", code=2)
    remote_key, target = parse_peer(key, address, what="listener key")
    trio.run(_dial, keypair, remote_key, target, quiet)


async def _listen(keypair: KeyPair, host: str, port: int, quiet: bool) -> None:
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    bound = listeners[0].socket.getsockname()
    err.print(f"listening on {host}:{bound[1]} key {keypair.hex}", markup=False)
    listener = listeners[0]
    for extra in listeners[1:]:
        await extra.aclose()
    async with listener:
        while True:
            raw = await listener.accept()
            try:
                stream = await SecretStream.responder(raw, keypair)
            except HandshakeError as exc:
                # A scanner or a stale client must not consume the beam.
                err.print(f"beam: refused a connection: {exc}", markup=False)
                continue
            break
    await _pipe(stream, quiet)


async def _dial(
    keypair: KeyPair, remote_key: bytes, target: tuple[str, int], quiet: bool
) -> None:
    host, port = target
    try:
        raw = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        fail(f"cannot connect to {host}:{port}: {connect_failure_reason(exc)}")
    try:
        stream = await SecretStream.initiator(raw, keypair, remote_key)
    except HandshakeError as exc:
        fail(f"handshake with {host}:{port} failed: {exc}")
    await _pipe(stream, quiet)


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
