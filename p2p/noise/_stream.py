"""The trio driver of the secret stream.

:class:`SecretStream` runs the sans-IO :class:`~._handshake.Handshake` and
:class:`~._transport.Transport` over any ``trio.abc.Stream`` (TCP, a relayed
splice, an in-memory pair) and is itself a ``trio.abc.HalfCloseableStream``.

Invariants kept here:

* Frames are encrypted and written under one lock, so the nonce order on the
  wire is the order of encryption, whoever writes (application or keep-alive).
* Two tasks sending (or two receiving) at once get ``trio.BusyResourceError``,
  as with ``trio.SSLStream``.
* A send cancelled half-way leaves a partial frame on the wire: the stream is
  marked broken (``SEND_CANCELLED``), as h11 does with ``send_failed()``.
* A session may move to another path (another ``trio.abc.Stream`` to the same
  peer, proven by :mod:`p2p.punch`): the writer ends the old path with a
  MIGRATE frame naming the new one and writes on there; the reader reads the
  old path up to that frame, then the new one. Each direction moves on its
  own; nonces carry on, so no frame is lost, repeated or reordered.
* Over a ``trio.SocketStream`` the stream reads and writes the socket's file
  descriptor itself (``os.read``/``os.write`` after ``trio.lowlevel.wait_readable``
  / ``wait_writable``, all public API): a read waits for readability first,
  instead of a failed non-blocking ``recv`` and its exception per message, and
  :meth:`SecretStream.send_nowait` writes without a scheduler pass. Other
  transports go through their ``send_all``/``receive_some``.
* Failures keep trio's meanings: after our own ``aclose()`` calls raise
  ``trio.ClosedResourceError``; when the peer or the network ended it they
  raise :class:`~p2p.errors.ConnectionBroken` (a ``trio.BrokenResourceError``)
  whose ``code`` says why.
"""

from __future__ import annotations

import errno
import logging
import operator
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ..errors import ConnectionBroken, HandshakeError, IdleTimeout, RemoteProtocolError
from ..keys import KeyPair, format_key
from ._config import SMALL_RECEIVE_BYTES, SecretStreamConfig
from ._handshake import Handshake
from ._transport import NEED_DATA, PATH_ID_BYTES, Ack, Data, EndOfStream, Migrate, Transport

__all__ = ["SecretStream", "SecretStreamStatistics"]

log = logging.getLogger(__name__)

_DEFAULT_CONFIG = SecretStreamConfig()
_HANDSHAKE_READ_BYTES = 4096
#: A read at least this large means bulk traffic (see SecretStream._receive).
_BULK_READ_BYTES = 16 * 1024
#: The id of the path a stream starts on (ids of later paths are random).
FIRST_PATH_ID = bytes(PATH_ID_BYTES)
#: How long a reader that met the peer's MIGRATE waits for that path to be
#: offered here (both ends prove a path before either moves to it).
MIGRATE_WAIT_S = 10.0
#: With a standby path kept: acknowledge the peer's frames every this many.
ACK_EVERY_FRAMES = 32
#: With a standby path kept: frames sent and not yet acknowledged, at most (in
#: bytes). A peer that stops acknowledging costs us this much memory, then the
#: standby is given up (the stream goes on, without a fallback).
MAX_UNACKED_BYTES = 32 * 1024 * 1024


def _socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    return stream.socket if type(stream) is trio.SocketStream else None


class _ConflictDetector:
    """Raise BusyResourceError when two tasks enter the same one-at-a-time operation."""

    __slots__ = ("_held", "_message")

    def __init__(self, message: str) -> None:
        self._message = message
        self._held = False

    def __enter__(self) -> None:
        if self._held:
            raise trio.BusyResourceError(self._message)
        self._held = True

    def __exit__(self, *exc: object) -> None:
        self._held = False


@dataclass(frozen=True)
class SecretStreamStatistics:
    bytes_sent: int
    bytes_received: int
    frames_sent: int
    frames_received: int
    keepalives_received: int


class SecretStream(trio.abc.HalfCloseableStream):
    """An authenticated, encrypted byte stream to a peer known by its public key.

    Build one with :meth:`initiator` (the dialer, which pins the key it
    expects) or :meth:`responder`. To send keep-alives while the stream is
    quiet, run :meth:`keep_alive` in a nursery you own.
    """

    def __init__(
        self,
        transport_stream: trio.abc.Stream,
        transport: Transport,
        *,
        keypair: KeyPair,
        remote_public_key: bytes,
        handshake_hash: bytes,
        is_initiator: bool,
        config: SecretStreamConfig = _DEFAULT_CONFIG,
    ) -> None:
        #: The path our frames go out on, and the one the peer's come in on.
        self._write_stream = transport_stream
        self._read_stream = transport_stream
        self.write_path_id = FIRST_PATH_ID
        self.read_path_id = FIRST_PATH_ID
        #: Paths proven to reach the peer's end of this session, not in use yet.
        self._offered: dict[bytes, trio.abc.Stream] = {}
        #: The path kept to fall back to when the active one dies (its id and
        #: stream), with what we sent since it was kept and the peer has not
        #: acknowledged: (index of the first frame, the frames, how many).
        self._standby: tuple[bytes, trio.abc.Stream] | None = None
        self._unacked: deque[tuple[int, bytes | bytearray, int]] = deque()
        self._unacked_bytes = 0
        self._acked_to_peer = 0
        self._ack_due = False
        self._write_failover_due = False
        #: Paths that died: a MIGRATE naming one (resent after a fallback) is ignored.
        self._dead_paths: set[bytes] = set()
        #: Bytes read past the peer's MIGRATE on the path kept as standby (they
        #: are what it sent there after falling back): read first on the way back.
        self._standby_stash = b""
        #: Wakes keep_alive() for an acknowledgement or a fallback to write.
        self._poke = trio.Event()
        #: Set (and replaced) each time the stream falls back to its standby path.
        self.fell_back = trio.Event()
        #: Where each path leads, when the one who offered it said.
        self._addresses: dict[bytes, tuple[str, int]] = {}
        self._paths_changed = trio.Event()
        self.public_key = keypair.public_key
        self.remote_public_key = remote_public_key
        self.handshake_hash = handshake_hash
        self.is_initiator = is_initiator
        self.config = config
        self._transport = transport
        self._send_conflict = _ConflictDetector("another task is already sending on this stream")
        self._receiving = False
        self._write_lock = trio.StrictFIFOLock()
        self._pending = memoryview(b"")
        self._eof_received = False
        self._closed = False
        self._broken: ConnectionBroken | None = None
        self._done = trio.Event()
        #: The run's clock: ``now()`` is trio.current_time() without two layers
        #: of calls (it is read once per message).
        self._now = trio.lowlevel.current_clock().current_time
        self._last_send = self._now()
        self._bytes_sent = 0
        self._bytes_received = 0
        self._keepalives_received = 0
        self._peer = format_key(remote_public_key)[:12]
        self._small_read = min(SMALL_RECEIVE_BYTES, config.receive_chunk_bytes)
        #: True while keep_alive() enforces the idle timeout on waiting reads.
        self._idle_watched = False
        self._read_waiting_since: float | None = None
        self._read_size = self._small_read
        #: The trio socket under a plain ``trio.SocketStream`` (read and written
        #: through its descriptor), or None for any other transport.
        self._write_sock = self._read_sock = _socket_of(transport_stream)
        #: Ciphertext that send_nowait() could not write at once; it goes out
        #: before anything else (see flush()).
        self._backlog = b""
        self._send_slice = config.send_slice_bytes
        #: The last read was large (bulk traffic): more is likely waiting, so
        #: read before waiting for readability.
        self._read_full = False

    # -- construction ------------------------------------------------------

    @classmethod
    async def initiator(
        cls,
        transport_stream: trio.abc.Stream,
        keypair: KeyPair,
        remote_public_key: bytes | None,
        *,
        config: SecretStreamConfig = _DEFAULT_CONFIG,
    ) -> SecretStream:
        """Run the handshake as the dialer and return the open stream.

        Args:
            transport_stream: a connected stream; owned by the result afterwards.
            keypair: our identity.
            remote_public_key: the key the peer must prove. ``None`` accepts
                any peer (only for tools that print what they reached).
            config: timeouts and sizes.

        Raises:
            HandshakeError: ``KEY_MISMATCH`` (``.expected``/``.actual`` set),
                ``TIMEOUT``, ``CLOSED``, ``BAD_MESSAGE``, ``BAD_PROOF`` ...; the
                transport stream is closed.
        """
        handshake = Handshake(
            keypair, initiator=True, expected_remote_key=remote_public_key, prologue=config.prologue
        )
        return await cls._establish(transport_stream, handshake, keypair, config)

    @classmethod
    async def responder(
        cls,
        transport_stream: trio.abc.Stream,
        keypair: KeyPair,
        *,
        config: SecretStreamConfig = _DEFAULT_CONFIG,
        on_receive: Callable[[int], None] | None = None,
        on_message: Callable[[], None] | None = None,
    ) -> SecretStream:
        """Run the handshake as the accepting side; see :meth:`initiator`.

        ``on_receive(n)`` is called after each read of ``n`` handshake bytes
        (the host's admission tells a silent socket from a slow one with it);
        ``on_message()`` after each whole handshake message of the peer's was
        parsed and answered (a byte is cheap; a message that parses is not
        proof either, but it is what a real peer sends at once).
        """
        handshake = Handshake(keypair, initiator=False, prologue=config.prologue)
        return await cls._establish(transport_stream, handshake, keypair, config, on_receive,
                                    on_message)

    @classmethod
    async def _establish(
        cls,
        transport_stream: trio.abc.Stream,
        handshake: Handshake,
        keypair: KeyPair,
        config: SecretStreamConfig,
        on_receive: Callable[[int], None] | None = None,
        on_message: Callable[[], None] | None = None,
    ) -> SecretStream:
        role = "initiator" if handshake.initiator else "responder"
        log.debug("handshake.started role=%s", role)
        try:
            with trio.fail_after(config.handshake_timeout_s):
                if handshake.initiator:
                    await transport_stream.send_all(handshake.initiate())
                while not handshake.complete:
                    data = await transport_stream.receive_some(_HANDSHAKE_READ_BYTES)
                    if not data:
                        raise HandshakeError(
                            "the peer closed the connection during the handshake", code="CLOSED"
                        )
                    if on_receive is not None:
                        on_receive(len(data))
                    reply = handshake.receive_data(data)
                    if reply:
                        await transport_stream.send_all(reply)
                        if on_message is not None:
                            on_message()
        except BaseException as exc:
            await trio.aclose_forcefully(transport_stream)
            if isinstance(exc, trio.TooSlowError):
                error = HandshakeError(
                    f"no handshake within {config.handshake_timeout_s} s", code="TIMEOUT"
                )
            elif isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                error = HandshakeError(
                    f"the connection broke during the handshake: {exc}", code="CLOSED"
                )
            elif isinstance(exc, HandshakeError):
                log.debug("handshake.failed role=%s code=%s reason=%s", role, exc.code, exc)
                raise
            else:
                raise
            log.debug("handshake.failed role=%s code=%s reason=%s", role, error.code, error)
            raise error from exc
        assert handshake.remote_public_key is not None
        assert handshake.handshake_hash is not None
        log.debug(
            "handshake.complete role=%s peer=%s",
            role,
            format_key(handshake.remote_public_key)[:12],
        )
        return cls(
            transport_stream,
            handshake.transport(),
            keypair=keypair,
            remote_public_key=handshake.remote_public_key,
            handshake_hash=handshake.handshake_hash,
            is_initiator=handshake.initiator,
            config=config,
        )

    # -- sending -----------------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._send_conflict:
            self._check_can_send()
            size = len(data)
            if size == 0:
                await trio.lowlevel.checkpoint()
                return
            view = memoryview(data)
            step = self.config.send_slice_bytes
            for start in range(0, size, step):
                piece = view[start : start + step]
                await self._acquire_write_lock()
                try:
                    self._check_can_send()
                    if self._standby is None:
                        await self._write(self._transport.send_data(piece))
                    else:
                        await self._write(self._ack_frames() + self._seal(
                            self._transport.send_data, piece))
                finally:
                    self._write_lock.release()
                self._bytes_sent += len(piece)

    def send_nowait(self, data: bytes | bytearray | memoryview) -> bool:
        """Encrypt ``data`` and write it now, without waiting or yielding.

        For a sender that reaches a checkpoint soon after anyway (the mux):
        it saves the scheduler pass of a ``send_all``. Only over a
        ``trio.SocketStream``, when no other write is in progress and nothing
        is left from an earlier call.

        Returns:
            False if it sent nothing (use :meth:`send_all`). True if ``data``
            was taken: whatever the kernel did not accept at once is kept, in
            order, and written by the next :meth:`send_all`, :meth:`flush` or
            keep-alive; check :attr:`unflushed` and call :meth:`flush` if set.

        Raises:
            trio.ClosedResourceError / ConnectionBroken: as :meth:`send_all`.
        """
        sock = self._write_sock
        if (
            sock is None
            or self._ack_due
            or self._write_failover_due
            or self._backlog
            or self._write_lock.locked()
            or not data
            or len(data) > self._send_slice
        ):
            return False
        if self._closed or self._broken is not None or self._transport.end_sent:
            self._check_can_send()  # raises
        fd = sock.fileno()
        if fd < 0:
            if self._can_fall_back_writes():
                return False  # send_all() finds the path closed and falls back
            raise self._closed_error()
        if self._standby is None:
            frames = self._transport.send_data(data)
        else:
            frames = self._seal(self._transport.send_data, data)
        try:
            sent = os.write(fd, frames)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            if self._can_fall_back_writes():
                # The frames are kept: keep_alive() resends them on the standby.
                self._write_failover_due = True
                self._poke.set()
                self._bytes_sent += len(data)
                return True
            # The peer reset the connection (or the socket was shut): as a
            # failed send_all. _break closes the transport on its own time.
            self._broken_now(
                ConnectionBroken(f"connection to {self._peer} lost while sending",
                                 code="CONNECTION_LOST"),
                exc,
            )
            raise self._closed_error() from exc
        if sent < len(frames):
            self._backlog = memoryview(frames)[sent:]
        self._bytes_sent += len(data)
        self._last_send = self._now()
        return True

    @property
    def unflushed(self) -> int:
        """Bytes taken by :meth:`send_nowait` that are not yet written."""
        return len(self._backlog)

    async def flush(self) -> None:
        """Write what :meth:`send_nowait` left over (a checkpoint even if nothing)."""
        with self._send_conflict:
            if not self._backlog:
                await trio.lowlevel.checkpoint()
                return
            if self._closed:
                raise trio.ClosedResourceError("the stream was closed")
            if self._broken is not None:
                raise self._broken
            await self._acquire_write_lock()
            try:
                await self._write(b"")
            finally:
                self._write_lock.release()

    async def wait_send_all_might_not_block(self) -> None:
        with self._send_conflict:
            self._check_can_send()
            await self._write_stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        """Tell the peer we send no more; receiving goes on."""
        with self._send_conflict:
            if self._closed:
                raise trio.ClosedResourceError("the stream was closed")
            if self._transport.end_sent:
                await trio.lowlevel.checkpoint()
                return
            if self._broken is not None:
                raise self._broken
            async with self._write_lock:
                await self._write(self._seal(self._transport.send_end))

    async def keep_alive(self) -> None:
        """Send keep-alives, and watch the idle timeout, while the stream lives.

        Run it in a nursery you own; it returns when the stream closes or
        breaks, and never raises for those. While it runs it also enforces
        ``idle_timeout_s`` on waiting reads, so reads need no timer of their
        own; reads that start while it is not running carry their own deadline.
        Keep-alives stop once our end is sent; the idle watch goes on.
        """
        interval = self.config.keepalive_interval_s
        idle = self.config.idle_timeout_s
        if interval is None and idle is None:
            return
        # Wake at least this often even with nothing due (a read may start
        # any time; its deadline is then computed on the next wake).
        check_every = min(x for x in (interval, idle / 4 if idle else None) if x)
        self._idle_watched = idle is not None
        try:
            while not self._done.is_set():
                now = trio.current_time()
                waiting_since = self._read_waiting_since
                if idle is not None and waiting_since is not None and now >= waiting_since + idle:
                    if self._standby is not None and self._read_stream is not self._standby[1]:
                        # The active path went silent: drop it; the reader, woken
                        # by the close, falls back to the standby path.
                        log.info("stream.path_silent peer=%s: falling back", self._peer)
                        self._read_waiting_since = None
                        await trio.aclose_forcefully(self._read_stream)
                        continue
                    await self._break(
                        IdleTimeout(f"nothing received from {self._peer} in {idle} s"), None
                    )
                    return
                sending = interval is not None and not self._transport.end_sent
                if not sending and idle is None:
                    return
                if sending and now >= self._last_send + interval:
                    try:
                        async with self._write_lock:
                            if self._done.is_set():
                                return
                            if not self._transport.end_sent:
                                await self._write(self._seal(self._transport.send_keepalive))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return
                    continue
                if self._standby is not None and (self._ack_due or self._write_failover_due):
                    try:
                        await self._maintain()
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return
                    continue
                wake = now + check_every
                if sending:
                    wake = min(wake, self._last_send + interval)
                if idle is not None and waiting_since is not None:
                    wake = min(wake, waiting_since + idle)
                with trio.move_on_at(wake):
                    await self._poke.wait()
                if self._poke.is_set() and not self._done.is_set():
                    self._poke = trio.Event()
        finally:
            self._idle_watched = False

    async def _acquire_write_lock(self) -> None:
        # Lock.acquire() always yields to the scheduler, a full extra pass per
        # send; when nobody holds the lock, take it without yielding (the
        # socket write that follows is the operation's checkpoint).
        try:
            self._write_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._write_lock.acquire()

    async def _write(self, frames: bytes | bytearray) -> None:
        # Called with the write lock held, right after encrypting `frames`.
        try:
            if self._backlog:
                # Encrypted before `frames`: it goes first (nonce order).
                backlog = self._backlog
                self._backlog = b""
                await self._write_stream.send_all(backlog)
            if frames:
                await self._write_stream.send_all(frames)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if self._can_fall_back_writes():
                await self._fall_back_writes()  # what failed is in the resent frames
                return
            if isinstance(exc, trio.ClosedResourceError):
                raise self._closed_error() from None
            raise await self._break(
                ConnectionBroken(f"connection to {self._peer} lost while sending",
                                 code="CONNECTION_LOST"),
                exc,
            ) from exc
        except trio.Cancelled:
            # Part of a frame may be on the wire: the peer's cipher is out of step.
            if self._broken is None and not self._closed:
                self._broken = ConnectionBroken(
                    "a send was cancelled part-way; the stream cannot be used again",
                    code="SEND_CANCELLED",
                )
                self._done.set()
            raise
        self._last_send = self._now()

    def _check_can_send(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream was closed")
        if self._broken is not None:
            raise self._broken
        if self._transport.end_sent:
            raise trio.ClosedResourceError("cannot send after send_eof()")

    # -- receiving ---------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this stream")
        self._receiving = True
        try:
            if max_bytes is not None:
                max_bytes = operator.index(max_bytes)
                if max_bytes < 1:
                    raise ValueError("max_bytes must be >= 1")
            transport = self._transport
            waited = False  # a read from the transport is this call's checkpoint
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("the stream was closed")
                if self._pending:
                    if not waited:
                        await trio.lowlevel.checkpoint()
                    return self._take_pending(max_bytes)
                if self._broken is not None:
                    raise self._broken
                if self._eof_received:
                    if not waited:
                        await trio.lowlevel.checkpoint()
                    return b""
                if not waited and not transport.buffered_bytes:
                    # Nothing buffered: no frame can be complete, read first.
                    await self._read_more()
                    waited = True
                    continue
                try:
                    event = transport.next_event()
                except RemoteProtocolError as exc:
                    raise await self._break(
                        ConnectionBroken(f"{exc} (from {self._peer})", code=exc.code), exc
                    ) from exc
                if event is NEED_DATA:
                    await self._read_more()
                    waited = True
                elif type(event) is Data:
                    data = event.data
                    self._bytes_received += len(data)
                    if self._standby is not None:
                        self._note_received()
                    if max_bytes is None or max_bytes >= len(data):
                        if not waited:
                            await trio.lowlevel.checkpoint()
                        return data
                    self._pending = memoryview(data)
                elif type(event) is EndOfStream:
                    self._eof_received = True
                elif type(event) is Migrate:
                    await self._follow(event.path_id)
                    waited = True
                elif type(event) is Ack:
                    self._forget_acked(event.count)
                else:
                    self._keepalives_received += 1
        finally:
            self._receiving = False

    def _take_pending(self, max_bytes: int | None) -> bytes:
        pending = self._pending
        if max_bytes is None or max_bytes >= len(pending):
            self._pending = memoryview(b"")
            return pending.obj if len(pending) == len(pending.obj) else bytes(pending)
        self._pending = pending[max_bytes:]
        return bytes(pending[:max_bytes])

    async def _receive(self, ask: int) -> bytes:
        sock = self._read_sock
        if sock is None:
            return await self._read_stream.receive_some(ask)
        # Wait for readability first: a read that fails (EAGAIN) costs a system
        # call and an exception, and most messages find the socket empty. Only
        # after a large read (bulk traffic) is more likely waiting: then read
        # after a plain checkpoint, as trio does (waiting first would wake us
        # at the first bytes of each write, for many small reads).
        # The descriptor is checked once per read: closing a trio socket wakes
        # whoever waits on it (notify_closing) before the number is freed.
        fd = sock.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the socket was closed")
        if self._read_full:
            await trio.lowlevel.checkpoint()
            if sock.fileno() < 0:
                raise trio.ClosedResourceError("the socket was closed")
        else:
            await trio.lowlevel.wait_readable(fd)
        while True:
            try:
                return os.read(fd, ask)
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the socket was closed") from None
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            await trio.lowlevel.wait_readable(fd)

    async def _read_more(self) -> None:
        idle = self.config.idle_timeout_s
        ask = self._read_size
        try:
            if idle is None or self._idle_watched:
                # keep_alive() watches this read's age: no cancel scope per read
                # (~7 us each, a few percent of a loopback round trip).
                self._read_waiting_since = self._now()
                try:
                    data = await self._receive(ask)
                finally:
                    self._read_waiting_since = None
            else:
                data = None
                with trio.move_on_after(idle):
                    data = await self._receive(ask)
                if data is None:
                    raise await self._break(
                        IdleTimeout(f"nothing received from {self._peer} in {idle} s"), None
                    )
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if self._can_fall_back_reads():
                await self._fall_back_reads()
                return
            if isinstance(exc, trio.ClosedResourceError):
                raise self._closed_error() from None
            raise await self._break(
                ConnectionBroken(f"connection to {self._peer} lost", code="CONNECTION_LOST"), exc
            ) from exc
        if not data and self._can_fall_back_reads() and not self._transport_end_received():
            await self._fall_back_reads()  # the active path ended without our END
            return
        if data:
            # Bulk traffic fills reads: ask for more next time. Quiet traffic
            # stays below the size where each read's buffer costs an mmap().
            full = len(data) >= ask
            # Bulk traffic: data keeps coming, try reading before waiting.
            self._read_full = len(data) >= _BULK_READ_BYTES
            self._read_size = self.config.receive_chunk_bytes if full else self._small_read
            self._transport.receive_data(data)
        elif self._transport.buffered_bytes:
            raise await self._break(
                ConnectionBroken(
                    f"{self._peer} closed the connection in the middle of a frame",
                    code="TRUNCATED",
                ),
                None,
            )
        else:
            self._eof_received = True

    # -- moving to another path -------------------------------------------

    @property
    def transport_stream(self) -> trio.abc.Stream:
        """The stream our frames are written to now."""
        return self._write_stream

    @property
    def path_secret(self) -> bytes:
        """A secret only the two ends of this session hold (to prove new paths with)."""
        assert self._transport.path_secret is not None
        return self._transport.path_secret

    def offer_path(self, path_id: bytes, stream: trio.abc.Stream, *,
                   address: tuple[str, int] | None = None) -> None:
        """Add a path proven to reach the peer's end of this session.

        Nothing moves yet: :meth:`migrate` moves our writes to it, and the
        peer's MIGRATE naming it moves our reads. The stream owns it from now
        on (closes it when it is left or when the stream ends).

        Raises:
            ValueError: a wrong-sized or already used id.
            trio.ClosedResourceError / ConnectionBroken: the stream has ended.
        """
        if len(path_id) != PATH_ID_BYTES:
            raise ValueError(f"a path id is {PATH_ID_BYTES} bytes")
        if path_id in self._offered or path_id in (self.read_path_id, self.write_path_id):
            raise ValueError("a path with this id was offered already")
        if self._closed or self._broken is not None:
            raise self._closed_error()
        self._offered[path_id] = stream
        if address is not None:
            self._addresses[path_id] = address
        changed, self._paths_changed = self._paths_changed, trio.Event()
        changed.set()

    async def migrate(self, path_id: bytes) -> None:
        """Move our writes to an offered path: MIGRATE ends the old one.

        Safe while other tasks send: it waits for the write in progress and
        goes between two frames. The old path is closed once the peer has
        moved its writes off it too.

        Raises:
            KeyError: no path with this id was offered.
            trio.ClosedResourceError / ConnectionBroken: as :meth:`send_all`.
        """
        stream = self._path(path_id)
        if stream is None:
            raise KeyError("no path with this id was offered")
        await self._acquire_write_lock()
        try:
            self._check_can_send()
            await self._write(self._seal(self._transport.send_migrate, path_id))
            old, self._write_stream = self._write_stream, stream
            self.write_path_id = path_id
            self._write_sock = _socket_of(stream)
            self._offered.pop(path_id, None)
        finally:
            self._write_lock.release()
        log.debug("stream.migrated peer=%s direction=send", self._peer)
        await self._retire(old)

    def _path(self, path_id: bytes) -> trio.abc.Stream | None:
        if path_id == self.write_path_id:
            return self._write_stream
        if path_id == self.read_path_id:
            return self._read_stream
        return self._offered.get(path_id)

    @property
    def read_path_address(self) -> tuple[str, int] | None:
        """Where the path the peer's frames come in on leads (if its offer said)."""
        return self._addresses.get(self.read_path_id)

    async def discard_offered(self) -> None:
        """Close the offered paths that neither direction took."""
        offered, self._offered = self._offered, {}
        for stream in offered.values():
            await trio.aclose_forcefully(stream)

    async def wait_path_change(self) -> None:
        """Wait until a path is offered or either direction moves."""
        await self._paths_changed.wait()

    async def _follow(self, path_id: bytes) -> None:
        """The peer's MIGRATE arrived: read on from the path it names."""
        if path_id in self._dead_paths:
            return  # resent after a fallback: that path is gone, we stay here
        if self._transport.buffered_bytes:
            if self._standby is not None and self._read_stream is self._standby[1]:
                # The peer fell back already: its RESUME and resent frames came
                # right after; keep them for when we fall back too.
                self._standby_stash = self._transport.take_buffered()
            else:
                raise await self._break(
                    ConnectionBroken(f"{self._peer} sent frames after MIGRATE on the old path",
                                     code="DATA_AFTER_MIGRATE"), None)
        with trio.move_on_after(MIGRATE_WAIT_S):
            while self._path(path_id) is None and not self._done.is_set():
                await self._paths_changed.wait()
        stream = self._path(path_id)
        if stream is None:
            if self._closed:
                raise trio.ClosedResourceError("the stream was closed")
            raise await self._break(
                ConnectionBroken(f"{self._peer} moved to a path not offered here "
                                 f"within {MIGRATE_WAIT_S} s", code="UNKNOWN_PATH"), None)
        self._offered.pop(path_id, None)
        old = self._read_stream
        self._read_stream, self.read_path_id = stream, path_id
        self._read_sock = _socket_of(stream)
        self._read_full = False
        log.debug("stream.migrated peer=%s direction=receive", self._peer)
        await self._retire(old)

    async def _retire(self, old: trio.abc.Stream) -> None:
        """A direction left ``old``: close it once neither uses it (it carried
        both MIGRATE frames; nothing more will cross it)."""
        changed, self._paths_changed = self._paths_changed, trio.Event()
        changed.set()
        if (old is not self._read_stream and old is not self._write_stream
                and (self._standby is None or old is not self._standby[1])):
            await trio.aclose_forcefully(old)

    async def _close_paths(self, *, forcefully: bool) -> None:
        standby = (self._standby[1],) if self._standby is not None else ()
        paths = {id(s): s for s in (self._write_stream, self._read_stream,
                                    *self._offered.values(), *standby)}
        self._offered.clear()
        # Every path is closed, even when a close is cancelled part-way (a socket
        # stream closes, then raises Cancelled at its checkpoint): the rest are
        # closed forcefully and the cancellation goes on afterwards.
        cancelled: trio.Cancelled | None = None
        for stream in paths.values():
            try:
                if forcefully or cancelled is not None:
                    await trio.aclose_forcefully(stream)
                else:
                    await stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            except trio.Cancelled as exc:
                cancelled = exc
        if cancelled is not None:
            raise cancelled

    # -- falling back to a standby path -----------------------------------

    def keep_standby(self) -> None:
        """Keep the path our writes use now (the relayed one, before a punch moves
        them) as a standby: when the path the session moves to dies, both
        directions come back to it and nothing is lost. From now on every frame
        we send is kept until the peer acknowledges it (ACK frames), and we
        acknowledge the peer's. Call it before :meth:`migrate`."""
        self._standby = (self.write_path_id, self._write_stream)

    @property
    def standby_path_id(self) -> bytes | None:
        return self._standby[0] if self._standby is not None else None

    def _seal(self, encrypt: Callable[..., bytes | bytearray], *args: object
              ) -> bytes | bytearray:
        """``encrypt(*args)``, and while a standby is kept, remember the frames."""
        before = self._transport.frames_sent
        frames = encrypt(*args)
        if self._standby is not None:
            count = self._transport.frames_sent - before
            self._unacked.append((before, frames, count))
            self._unacked_bytes += len(frames)
            if self._unacked_bytes > MAX_UNACKED_BYTES:
                log.warning("stream.standby_dropped peer=%s unacked=%d: the peer does not "
                            "acknowledge; no fallback from now on", self._peer,
                            self._unacked_bytes)
                self._drop_standby()
        return frames

    def _ack_frames(self) -> bytes | bytearray:
        """An ACK to send before our next frames, if one is due (write lock held)."""
        if not self._ack_due or self._transport.end_sent:
            return b""
        self._ack_due = False
        self._acked_to_peer = self._transport.frames_received
        return self._seal(self._transport.send_ack, self._acked_to_peer)

    def _note_received(self) -> None:
        if self._transport.frames_received - self._acked_to_peer >= ACK_EVERY_FRAMES:
            self._ack_due = True
            self._poke.set()

    def _forget_acked(self, count: int) -> None:
        unacked = self._unacked
        while unacked and unacked[0][0] + unacked[0][2] <= count:
            self._unacked_bytes -= len(unacked.popleft()[1])

    def _drop_standby(self) -> None:
        self._standby = None
        self._unacked.clear()
        self._unacked_bytes = 0

    async def _maintain(self) -> None:
        """keep_alive()'s errands while a standby is kept: an acknowledgement, or
        moving our writes to the standby after the reader found the path dead."""
        async with self._write_lock:
            if self._done.is_set():
                return
            if self._write_failover_due and self._can_fall_back_writes():
                await self._fall_back_writes()
            elif self._ack_due and not self._transport.end_sent:
                await self._write(self._ack_frames())
            self._write_failover_due = False

    def _transport_end_received(self) -> bool:
        return self._eof_received

    def _can_fall_back_reads(self) -> bool:
        return (self._standby is not None and not self._closed and self._broken is None
                and self._read_stream is not self._standby[1])

    def _can_fall_back_writes(self) -> bool:
        return (self._standby is not None and not self._closed and self._broken is None
                and self._write_stream is not self._standby[1])

    async def _fall_back_reads(self) -> None:
        """The path the peer's frames came on died: read the standby from now on,
        starting with the peer's RESUME (which says what it resends)."""
        assert self._standby is not None
        standby_id, standby = self._standby
        dead_id, dead = self.read_path_id, self._read_stream
        self._dead_paths.add(dead_id)
        self._read_stream, self.read_path_id = standby, standby_id
        self._read_sock = _socket_of(standby)
        self._read_full = False
        self._transport.expect_resume(self._standby_stash)
        self._standby_stash = b""
        log.info("stream.fell_back peer=%s direction=receive", self._peer)
        if self._write_stream is dead:
            # Our writes go after it: keep_alive() moves them (or the next write,
            # which fails on the closed path, does).
            self._write_failover_due = True
            self._poke.set()
        await trio.aclose_forcefully(dead)
        self._announce_fallback()

    async def _fall_back_writes(self) -> None:
        """Our frames' path died (write lock held): on the standby, RESUME, then every
        frame the peer has not acknowledged, as first sent; then carry on there."""
        assert self._standby is not None
        standby_id, standby = self._standby
        dead_id, dead = self.write_path_id, self._write_stream
        self._dead_paths.add(dead_id)
        self._write_stream, self.write_path_id = standby, standby_id
        self._write_sock = _socket_of(standby)
        self._backlog = b""  # in the resent frames
        self._write_failover_due = False
        first = self._unacked[0][0] if self._unacked else self._transport.frames_sent
        resent = [self._transport.resume_frame(first)]
        resent += [frames for _, frames, _ in self._unacked]
        log.info("stream.fell_back peer=%s direction=send resent_frames=%d",
                 self._peer, self._transport.frames_sent - first)
        try:
            await standby.send_all(b"".join(resent))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise await self._break(
                ConnectionBroken(f"connection to {self._peer} lost: the direct path and "
                                 "the standby both failed", code="CONNECTION_LOST"), exc
            ) from exc
        self._last_send = self._now()
        if self._read_stream is dead:
            await trio.aclose_forcefully(dead)  # wakes the reader, which falls back too
        self._announce_fallback()

    def _announce_fallback(self) -> None:
        if self._read_stream is self._write_stream:
            fell, self.fell_back = self.fell_back, trio.Event()
            fell.set()
            changed, self._paths_changed = self._paths_changed, trio.Event()
            changed.set()

    # -- closing -----------------------------------------------------------

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._done.set()
        self._poke.set()
        try:
            idle_writer = not self._write_lock.locked()
            if self._broken is None and not self._transport.end_sent and idle_writer:
                with trio.move_on_after(self.config.close_timeout_s):
                    # What send_nowait() left goes before the END (nonce order).
                    backlog = bytes(self._backlog)
                    self._backlog = b""
                    await self._write_stream.send_all(backlog + self._transport.send_end())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await self._close_paths(forcefully=False)

    def statistics(self) -> SecretStreamStatistics:
        return SecretStreamStatistics(
            bytes_sent=self._bytes_sent,
            bytes_received=self._bytes_received,
            frames_sent=self._transport.frames_sent,
            frames_received=self._transport.frames_received,
            keepalives_received=self._keepalives_received,
        )

    def _closed_error(self) -> BaseException:
        if self._broken is not None:
            return self._broken
        return trio.ClosedResourceError("the stream was closed")

    def _broken_now(self, error: ConnectionBroken, cause: BaseException | None) -> None:
        """Record why the stream died without waiting; aclose() closes the transport."""
        self._poke.set()
        if self._broken is None:
            self._broken = error
            if cause is not None:
                error.__cause__ = cause
            log.debug("stream.broken peer=%s code=%s reason=%s", self._peer, error.code, error)
        self._done.set()

    async def _break(
        self, error: ConnectionBroken, cause: BaseException | None
    ) -> ConnectionBroken:
        """Record why the stream died, close the transport, return the error to raise."""
        self._poke.set()
        if self._broken is None:
            self._broken = error
            if cause is not None:
                error.__cause__ = cause
            log.debug("stream.broken peer=%s code=%s reason=%s", self._peer, error.code, error)
        self._done.set()
        await self._close_paths(forcefully=True)
        return self._broken
