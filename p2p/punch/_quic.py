"""One QUIC stream over a punched UDP 5-tuple, as a trio byte stream.

UDP gives a hole punch its only way through an endpoint-dependent NAT, but a
session needs what TCP gives: order, retransmission, congestion and flow
control. QUIC gives them; aioquic's ``QuicConnection`` is a sans-IO state
machine (datagrams in, datagrams out, one timer), driven here by one trio task
(:meth:`QuicPath.run`) on a socket that talks to one peer address only.

QuicPath's TLS authenticates nothing (a throwaway certificate, no check): the
path is proven to belong to the session by :func:`p2p.punch.prove_path` inside
the stream, and every byte on it is the secret stream's ciphertext, as on a
relayed path. Datagrams from any other address are dropped unread.

Backpressure: ``send_all`` waits while more than ``HIGH_WATER`` bytes of the
stream are unacknowledged; aioquic has no public measure of that, so its
sender's buffer is read (``QuicStream.sender._buffer``, stable since 1.0).
"""

from __future__ import annotations

import datetime
import errno
import functools
import logging
import math
import socket
import ssl

import trio
from aioquic.buffer import Buffer
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicPacketType, pull_quic_header

__all__ = ["ALPN", "QuicPath"]

log = logging.getLogger(__name__)
# aioquic logs every connection's negotiation at INFO under "quic": per-path
# chatter an operator does not need (our punch.* lines say what happened).
logging.getLogger("quic").setLevel(logging.WARNING)

ALPN = "cosmicac-path/1"
#: Unacknowledged stream bytes above which ``send_all`` waits.
HIGH_WATER = 1 << 20
#: Stream data handed to aioquic per call.
_SLICE = 64 * 1024
_IDLE_TIMEOUT_S = 30.0
_DATAGRAM_BYTES = 1350


@functools.cache
def _certificate() -> tuple[object, object]:
    """A throwaway self-signed certificate (QUIC needs one; nobody checks it)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cosmicac-path")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .sign(key, hashes.SHA256()))
    return cert, key


def _configuration(is_client: bool) -> QuicConfiguration:
    config = QuicConfiguration(is_client=is_client, alpn_protocols=[ALPN],
                               idle_timeout=_IDLE_TIMEOUT_S,
                               max_datagram_size=_DATAGRAM_BYTES)
    if is_client:
        config.verify_mode = ssl.CERT_NONE
        config.server_name = "cosmicac-path"
    else:
        config.certificate, config.private_key = _certificate()
    return config


#: The longest a close waits for the peer to acknowledge what was sent.
LINGER_S = 2.0


class QuicPath(trio.abc.HalfCloseableStream):
    """Stream 0 of a QUIC connection with ``peer`` on ``sock`` (a bound,
    non-blocking UDP socket this object owns from now on).

    Start it with ``await nursery.start(path.run)``; the client's start returns
    once the handshake is done, the server's once its first datagram came.
    """

    def __init__(self, sock: socket.socket, peer: tuple[str, int], *, is_client: bool) -> None:
        sock.setblocking(False)
        self._std = sock
        self._sock = trio.socket.from_stdlib_socket(sock)
        self.peer = peer
        self.is_client = is_client
        self._conn: QuicConnection | None = (
            QuicConnection(configuration=_configuration(True)) if is_client else None)
        self._stream_id = 0
        self._received = bytearray()
        self._eof = False
        self._closed = False
        self._error: str | None = None
        self._changed = trio.Event()
        self._handshake = trio.Event()
        self._timer_scope: trio.CancelScope | None = None
        self._receiving = False
        self._sending = False
        #: :meth:`run`'s loop is feeding the connection (else aclose feeds it).
        self._driving = False

    # -- the driver ------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  handshake_timeout_s: float = 10.0) -> None:
        """Feed datagrams and timers to the connection until it ends."""
        if self._conn is not None:
            self._conn.connect(self.peer, trio.current_time())
            self._transmit()
        started = False
        try:
            with trio.fail_after(handshake_timeout_s):
                while not self._handshake.is_set():  # bounded by the deadline
                    await self._step()
            task_status.started()
            started = True
            self._driving = True
            while not self._closed and self._error is None:  # until closed or failed
                await self._step()
        except trio.TooSlowError:
            self._fail("no QUIC handshake in time")
            if not started:
                raise OSError(errno.ETIMEDOUT, "no QUIC handshake with "
                              f"{self.peer[0]}:{self.peer[1]}") from None
        except trio.ClosedResourceError:
            self._fail("the path was closed")  # aclose() while we waited
        except OSError as exc:
            self._fail(f"socket error: {exc}")
            if not started:
                raise
        finally:
            self._driving = False
            self._wake()

    async def _step(self) -> None:
        conn = self._conn
        timer = conn.get_timer() if conn is not None else None
        with trio.CancelScope(deadline=math.inf if timer is None else timer) as scope:
            self._timer_scope = scope
            data, address = await self._sock.recvfrom(65536)
        self._timer_scope = None
        now = trio.current_time()
        if scope.cancelled_caught:
            if conn is not None:
                conn.handle_timer(now)
        else:
            if address[:2] != self.peer:
                return  # only the punched peer's datagrams count
            if conn is None:
                if not data or not data[0] & 0x80:
                    return  # only a long header (an Initial) starts the server
                try:
                    header = pull_quic_header(Buffer(data=data), host_cid_length=8)
                except ValueError:
                    return
                if header.packet_type != QuicPacketType.INITIAL:
                    return
                conn = self._conn = QuicConnection(
                    configuration=_configuration(False),
                    original_destination_connection_id=header.destination_cid)
            conn.receive_datagram(data, address, now)
        self._drain_events()
        self._transmit()

    def _drain_events(self) -> None:
        assert self._conn is not None
        while (event := self._conn.next_event()) is not None:
            if isinstance(event, events.HandshakeCompleted):
                self._handshake.set()
            elif isinstance(event, events.StreamDataReceived):
                if event.stream_id == self._stream_id:
                    self._received += event.data
                    if event.end_stream:
                        self._eof = True
            elif isinstance(event, events.StreamReset):
                if event.stream_id == self._stream_id:
                    self._fail("the peer reset the stream")
            elif isinstance(event, events.ConnectionTerminated):
                self._fail(f"QUIC connection closed ({event.reason_phrase or event.error_code})")
        self._wake()

    def _transmit(self) -> None:
        conn = self._conn
        if conn is None or self._std.fileno() < 0:
            return
        for data, address in conn.datagrams_to_send(trio.current_time()):
            try:
                self._std.sendto(data, address)
            except BlockingIOError:
                pass  # a full socket buffer is a lost datagram: QUIC resends it
            except OSError as exc:
                log.debug("quic.send_failed to=%s reason=%s", address, exc)
        timer = conn.get_timer()
        if self._timer_scope is not None:
            self._timer_scope.deadline = math.inf if timer is None else timer

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _fail(self, reason: str) -> None:
        if self._error is None:
            self._error = reason
            log.debug("quic.path_ended peer=%s:%d reason=%s", *self.peer, reason)

    def _unacknowledged(self) -> int:
        """Stream bytes not yet acknowledged; a stream the server cannot send on
        yet (the client opens stream 0 with its first bytes) counts as full."""
        if self._conn is None:
            return HIGH_WATER
        stream = self._conn._streams.get(self._stream_id)
        if stream is None:
            return 0 if self.is_client else HIGH_WATER
        return len(stream.sender._buffer)

    # -- trio.abc.HalfCloseableStream -------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this path")
        self._sending = True
        try:
            view = memoryview(data)
            for start in range(0, max(len(view), 1), _SLICE):
                while True:  # bounded: each wake is an ACK, a failure or a close
                    self._check_open()
                    if self._unacknowledged() < HIGH_WATER:
                        break
                    await self._changed.wait()
                if len(view):
                    assert self._conn is not None
                    self._conn.send_stream_data(self._stream_id,
                                                bytes(view[start : start + _SLICE]))
                    self._transmit()
            await trio.lowlevel.checkpoint()
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        while self._unacknowledged() >= HIGH_WATER:  # bounded as in send_all
            self._check_open()
            await self._changed.wait()

    async def send_eof(self) -> None:
        self._check_open()
        assert self._conn is not None
        self._conn.send_stream_data(self._stream_id, b"", end_stream=True)
        self._transmit()
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this path")
        self._receiving = True
        try:
            while not self._received and not self._eof:  # bounded: each wake is news
                if self._closed:
                    raise trio.ClosedResourceError("the path was closed")
                if self._error is not None:
                    raise trio.BrokenResourceError(self._error)
                await self._changed.wait()
            size = len(self._received) if max_bytes is None else min(max_bytes,
                                                                      len(self._received))
            data = bytes(self._received[:size])
            del self._received[:size]
            await trio.lowlevel.checkpoint()
            return data
        finally:
            self._receiving = False

    def _lingering(self) -> bool:
        """Stream bytes (or its end) sent but not yet acknowledged by the peer."""
        stream = self._conn._streams.get(self._stream_id) if self._conn is not None else None
        if stream is None:
            return False
        sender = stream.sender
        return bool(sender._buffer) or (sender._buffer_fin is not None
                                        and not sender.is_finished)

    async def aclose(self) -> None:
        """Close, after what was sent is acknowledged (at most ``LINGER_S``).

        As a TCP socket's close hands its unsent bytes to the kernel, which still
        delivers them: here nothing would, and closing at once lost the end of a
        beam whose sender finished first (seen on a loaded machine). Shielded and
        bounded, as a close in a cancelled scope must still happen.
        """
        if not self._closed and self._error is None and self._lingering():
            with trio.CancelScope(shield=True), trio.move_on_after(LINGER_S):
                while self._lingering() and self._error is None:  # bounded by LINGER_S
                    try:
                        if self._driving:
                            await self._changed.wait()
                        else:  # run() has ended (cancelled with its nursery): feed it here
                            await self._step()
                    except (OSError, trio.ClosedResourceError):
                        break
        if not self._closed:
            self._closed = True
            if self._conn is not None and self._error is None:
                self._conn.close()
                self._transmit()
            self._sock.close()
            self._wake()
        await trio.lowlevel.checkpoint()

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the path was closed")
        if self._error is not None:
            raise trio.BrokenResourceError(self._error)
