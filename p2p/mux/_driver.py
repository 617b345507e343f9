"""Trio driver of the channel multiplexer.

:class:`Mux` runs one reader task and one writer task over any
:class:`trio.abc.Stream` and turns :class:`~p2p.mux._core.MuxCore` events into
wake-ups of waiting channel operations.

* The reader calls ``receive_some(receive_chunk_bytes)`` and feeds every byte to
  the core, which parses all complete frames per read.
* The writer takes *everything* queued since its last write (frames of every
  channel, already encoded) and hands it to the stream in one ``send_all``. Many
  small messages thus share one syscall (and one encryption on a secret stream).
* Fast path: a sending task that finds nothing being written, and that gave no
  ``more`` hint (other frames follow this pass), takes the writer role itself
  and writes what is queued, its own frame included, without waking the writer
  task: one scheduler pass less per message when traffic is light. Under load
  senders say ``more`` (the RPC layer does while other calls are in flight),
  frames are queued and the writer task sends them in one batch; frames queued
  while a sender writes are flushed by it afterwards. Whether unrelated tasks
  are runnable plays no part in it. Only one task writes at a time (the
  ``_writing`` flag is the writer role), and every writer takes the whole queue
  in order, so frames keep the order in which they were queued.
* A fast-path write is shielded from the sender's cancellation (the batch may
  hold other channels' frames, and a frame cut part-way would end the mux); it
  is bounded by its own deadline instead, after which the mux ends
  (``ChannelBroken``, code ``SEND_STALLED``). A write that fails ends the mux
  with the stream's code.
* Push delivery: a channel with a message handler
  (:meth:`Channel.set_message_handler`) gets its messages through that callback,
  run synchronously in the reader task as frames are parsed, instead of waking a
  receiving task; credit is returned as the callback takes each message.
* After a read the reader reads again at once (no extra scheduler pass); the
  tasks it woke run while it waits.
* Senders wait for channel credit, for the peer's connection-level credit (its
  receive budget; a sender short of it waits on its own channel's lot and is
  woken when a MUX_CREDIT frame arrives), and for room in the outgoing buffer
  (``max_send_buffer_bytes``, counting the batch being written), so a peer that
  stops reading holds our writers instead of growing our memory.

When the stream ends, breaks, or the peer breaks the protocol, the mux ends: the
stream is closed, pending receives (after draining what arrived) raise
:class:`ChannelBroken`, pending sends and opens raise it at once, and
:meth:`Mux.wait_closed` returns the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass

import trio

from p2p.errors import P2PError
from p2p.mux._channel import Channel
from p2p.mux._config import MuxConfig
from p2p.mux._core import (
    BudgetReceived,
    ChannelIncoming,
    ChannelPaired,
    ChannelPhase,
    ChannelState,
    CreditReceived,
    MessageReceived,
    MuxCore,
    MuxEvent,
    OpenRejected,
    RemoteClosed,
    RemoteEnded,
)
from p2p.mux._errors import (
    ChannelBroken,
    ChannelClosed,
    ChannelRejected,
    MuxError,
    MuxProtocolError,
    MuxUsageError,
)
from p2p.mux._frames import RejectReason
from p2p.mux._listener import ChannelListener
from p2p.mux._scheduling import BusyPoller, shared_poller

__all__ = ["ChannelListener", "Mux", "MuxStatistics"]

logger = logging.getLogger(__name__)

# What the stream under us may raise when it ends badly. P2PError covers a
# secret stream's own errors (e.g. a failed decryption) that are not trio ones.
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, P2PError)

# The fast path writes at most this much from a sending task. Bigger batches go
# through the writer task: they may block on a full socket buffer, and a sender
# cancelled while its own write is blocked must end the mux (see above), while a
# cancelled sender whose frames the writer task sends costs nothing. Small
# writes go straight into the kernel buffer unless the peer stopped reading.
_INLINE_MAX_BYTES = 64 * 1024
# How long a fast-path write may block (the peer's socket buffer full, i.e. the
# peer stopped reading) before the mux is declared broken (SEND_STALLED). Twice
# the secret stream's default keep-alive interval: a live peer reads sooner.
_INLINE_WRITE_TIMEOUT_S = 10.0

# Push delivery hands a channel's handler at most this many messages per
# scheduler pass; then the reader yields once so the tasks those messages woke
# (callers, handlers) run and queue their own frames before it goes on. Without
# it a burst of replies would wake every caller at once and their requests would
# leave in one batch, so client and server take turns instead of working at the
# same time. 16 is the burst the RPC read loops used before push delivery; 64
# cost ~5% fewer instructions per call (valgrind, one process) but a third of
# the calls per second across two processes, for exactly that reason.
_PUSH_BURST = 16

# A fast-path writer also sends what other tasks queued while it wrote (they
# would otherwise wait a pass for the writer task), but only this many writes in
# all, so one sender is not kept writing for everybody under load.
_INLINE_WRITES = 2


@dataclass(frozen=True, slots=True)
class MuxStatistics:
    """A snapshot of a mux's counters."""

    channels: int
    #: Bytes queued for, or being written by, the writer task.
    outgoing_bytes: int
    #: Bytes received and not yet taken by the application, over all channels,
    #: as charged against the receive budget (``len + 64`` per message).
    #: Never more than ``receive_budget_bytes``.
    buffered_bytes: int
    #: The most ``buffered_bytes`` has been since the mux was made.
    buffered_bytes_peak: int
    #: Our ``MuxConfig.receive_budget_bytes``.
    receive_budget_bytes: int
    #: Connection-level credit the peer's budget still allows us to use.
    send_budget_bytes: int
    #: Times a sender had to wait for the peer's connection-level credit.
    budget_waits: int
    #: Number of ``send_all`` calls (batches) and bytes written so far.
    writes: int
    bytes_written: int
    #: Number of ``receive_some`` calls that returned data and bytes read.
    reads: int
    bytes_read: int
    closed: bool


class Mux:
    """Channels over one byte stream, with per-channel credit backpressure.

    Args:
        stream: any :class:`trio.abc.Stream`; the mux owns it and closes it.
        config: windows and limits (defaults: :class:`MuxConfig`).
        name: names this mux in log lines.

    Start it in a nursery you own: ``await nursery.start(mux.run)``.
    """

    def __init__(
        self, stream: trio.abc.Stream, *, config: MuxConfig | None = None, name: str | None = None
    ) -> None:
        self._stream = stream
        self.config = config or MuxConfig()
        self.name = name or f"mux-{id(self):x}"
        self._core = MuxCore(self.config)
        #: The process-wide busy poller, once run() starts (None: polling off).
        self._poller: BusyPoller | None = None
        self._busy_poll_s = self.config.busy_poll_s
        self._live: dict[ChannelState, Channel] = {}
        #: Channels with a sender waiting for the peer's connection credit; they
        #: are woken (on their own send lot) when MUX_CREDIT arrives.
        self._budget_waiters: dict[Channel, None] = {}
        self._budget_waits = 0
        #: Channels whose pushed messages wait for the reader's next pass.
        self._push_later: list[Channel] = []
        self._listeners: dict[str, ChannelListener] = {}
        self._writer_lot = trio.lowlevel.ParkingLot()
        self._writer_idle = False
        #: The writer role: True while the writer task or a fast-path sender is
        #: inside ``stream.send_all``; nobody else may write then.
        self._writing = False
        self._space_lot = trio.lowlevel.ParkingLot()
        self._writing_bytes = 0
        #: The stream's synchronous write (a SecretStream over a socket), if any:
        #: a fast-path sender writes with it without a scheduler pass.
        self._send_nowait = getattr(stream, "send_nowait", None)
        #: send_nowait() left bytes in the stream: the writer task flushes them
        #: before anything else is written.
        self._flush_pending = False
        #: Frames the reader took for a write that the stream then refused
        #: (send_nowait() returned False): the writer task writes them first.
        #: The writer role is held for them meanwhile.
        self._handoff: bytes | None = None
        self._closed_event = trio.Event()
        self._drained = trio.Event()
        self._finished = trio.Event()
        self._closing = False
        self._reason: MuxError | None = None
        self._run_scope: trio.CancelScope | None = None
        self._started = False
        self._writes = 0
        self._bytes_written = 0
        self._reads = 0
        self._bytes_read = 0

    # -- lifetime --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Drive the mux until the stream ends, breaks or :meth:`aclose` is called.

        Returns normally however the mux ended (the reason is given by
        :meth:`wait_closed` and :attr:`closed_reason`); the stream is closed on
        return.

        Raises:
            MuxUsageError: ``ALREADY_RUNNING`` if called twice.
        """
        if self._started:
            raise MuxUsageError("Mux.run() was already called", code="ALREADY_RUNNING")
        self._started = True
        logger.debug("mux.started mux=%s", self.name)
        try:
            async with trio.open_nursery() as nursery:
                self._run_scope = nursery.cancel_scope
                if self._reason is not None:
                    nursery.cancel_scope.cancel()
                nursery.start_soon(self._reader)
                nursery.start_soon(self._writer)
                if self._busy_poll_s > 0:
                    self._poller = shared_poller()
                task_status.started()
        finally:
            self._terminate(ChannelClosed("mux task was cancelled", code="MUX_CANCELLED"))
            self._drained.set()
            try:
                await trio.aclose_forcefully(self._stream)
            finally:
                self._finished.set()
            logger.debug("mux.ended mux=%s reason=%r", self.name, self._reason)

    async def aclose(self) -> None:
        """Flush what is queued, then end the mux and close the stream. Idempotent.

        Channels raise :class:`ChannelClosed` afterwards. Wrap the call in a
        cancel scope to bound the flush.
        """
        try:
            if self._reason is None and self._started:
                self._closing = True
                self._kick()
                await self._drained.wait()
        finally:
            # Even if cancelled while flushing: a cancelled aclose still closes.
            self._terminate(ChannelClosed("mux was closed", code="MUX_CLOSED"))
            if self._run_scope is not None:
                self._run_scope.cancel()
            if not self._started:
                await trio.aclose_forcefully(self._stream)
        if self._started:
            await self._finished.wait()

    async def wait_closed(self) -> MuxError:
        """Wait until the mux has ended.

        Returns:
            Why: :class:`ChannelClosed` if we closed it, :class:`ChannelBroken`
            if the stream ended or broke, or the :class:`MuxProtocolError` the
            peer caused.
        """
        await self._closed_event.wait()
        assert self._reason is not None
        return self._reason

    @property
    def closed_reason(self) -> MuxError | None:
        """Why the mux ended, or None while it runs."""
        return self._reason

    @property
    def peer_opens(self) -> int:
        """Channels the peer has asked to open so far (answered or refused)."""
        return self._core.peer_opens

    def statistics(self) -> MuxStatistics:
        """Return a snapshot of the mux's counters."""
        return MuxStatistics(
            channels=self._core.channel_count,
            outgoing_bytes=self._core.outgoing_bytes + self._writing_bytes,
            buffered_bytes=self._core.buffered_bytes,
            buffered_bytes_peak=self._core.buffered_bytes_peak,
            receive_budget_bytes=self.config.receive_budget_bytes,
            send_budget_bytes=self._core.send_budget,
            budget_waits=self._budget_waits,
            writes=self._writes,
            bytes_written=self._bytes_written,
            reads=self._reads,
            bytes_read=self._bytes_read,
            closed=self._reason is not None,
        )

    def _broken_error(self) -> MuxError:
        reason = self._reason
        if isinstance(reason, ChannelClosed):
            return ChannelClosed(reason.message, code=reason.code)
        assert reason is not None
        err = ChannelBroken(f"mux ended: {reason.message}", code=reason.code)
        err.__cause__ = reason
        return err

    def _terminate(self, reason: MuxError) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        if self._run_scope is not None:
            self._run_scope.cancel()
        for ch in list(self._live.values()):
            ch._opened.set()
            ch._wake()
        self._live.clear()
        self._budget_waiters.clear()
        for listener in self._listeners.values():
            listener._lot.unpark_all()
        self._space_lot.unpark_all()
        self._closed_event.set()

    def _fail(self, exc: BaseException, code: str, message: str) -> None:
        if isinstance(exc, MuxProtocolError):
            logger.warning(
                "mux.protocol_error mux=%s code=%s error=%s", self.name, exc.code, exc.message
            )
            self._terminate(exc)
        else:
            logger.debug("mux.broken mux=%s code=%s error=%r", self.name, code, exc)
            if isinstance(exc, P2PError) and not isinstance(exc, MuxError):
                code = exc.code
            err = ChannelBroken(message, code=code)
            err.__cause__ = exc
            self._terminate(err)

    # -- tasks -----------------------------------------------------------------

    def _kick(self) -> None:
        # While someone holds the writer role it flushes or kicks again when done.
        if self._writer_idle and not self._writing:
            self._writer_idle = False
            self._writer_lot.unpark()

    async def _send_queued(self, *, checkpoint: bool, more: bool = False) -> None:
        """Get frames just queued by a sending task onto the stream.

        Writes them in this task when nobody is writing and the sender gave no
        ``more`` hint (the fast path; see the module docstring); else leaves
        them to the writer task and, if ``checkpoint``, yields once. Whether
        other tasks are runnable plays no part: only this mux's own state.
        """
        rest = self._send_fast(more)
        if rest is None:
            if checkpoint:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return
        await self._write_inline(rest or None)

    def _send_fast(self, more: bool) -> bytes | None:
        """The part of :meth:`_send_queued` that needs no waiting.

        Returns:
            None if the frames were written (``send_nowait``) or left to the
            writer task. Otherwise the sender must write them itself with
            ``await _write_inline(rest or None)``: ``rest`` holds the frames
            already taken from the core (``b""``: none taken).

        Raises:
            ChannelBroken / ChannelClosed: the stream failed.
        """
        core = self._core
        if (
            more
            or self._writing
            or core.outgoing_bytes > _INLINE_MAX_BYTES
            or self._reason is not None
        ):
            self._kick()
            return None
        send_nowait = self._send_nowait
        if send_nowait is None or self._flush_pending:
            return b""
        data = core.data_to_send()
        try:
            sent = send_nowait(data)
        except _STREAM_ERRORS as exc:
            self._fail(exc, "STREAM_BROKEN", "stream broke while sending")
            raise self._broken_error() from exc
        if not sent:
            return data
        # _sent(), inlined: once per message at low load.
        self._writes += 1
        self._bytes_written += len(data)
        if self._space_lot:
            self._space_lot.unpark_all()
        if self._poller is not None:
            self._poller.note_sent(self._busy_poll_s)
        unflushed = self._stream.unflushed  # type: ignore[attr-defined]
        if unflushed:
            self._flush_pending = True
            self._writing_bytes = unflushed
            self._kick()
        return None

    def _write_from_reader(self) -> None:
        """Write what the read just queued (answers of inline handlers, credit).

        The frames of every message this read brought are queued by now, so
        they go out in one write from the reader itself, as a fast-path sender
        writes its own: no hand-off to the writer task and its scheduler pass.
        Whatever cannot go at once without waiting is the writer's, as before.
        """
        rest = self._send_fast(False)
        if rest is None:
            return
        if not rest:
            self._kick()  # nothing taken: the writer flushes the stream first
            return
        # Taken but refused by the stream (an ACK or a path change is due):
        # the reader must not wait on a write, so the writer task writes these
        # frames, before anything queued after them (the role is held meanwhile).
        self._writing = True
        self._writing_bytes = len(rest)
        self._handoff = rest
        self._writer_idle = False
        self._writer_lot.unpark()

    def _sent(self, n: int) -> None:
        """Count a finished write of ``n`` bytes and wake who waits for room."""
        self._writes += 1
        self._bytes_written += n
        if self._space_lot:
            self._space_lot.unpark_all()
        if self._poller is not None:
            self._poller.note_sent(self._busy_poll_s)

    async def _write_inline(self, first: bytes | None = None) -> None:
        """Write everything queued from the calling task (it holds the writer role).

        Args:
            first: frames already taken from the core, to write first.

        Raises:
            ChannelBroken / ChannelClosed: the stream failed or the mux ended.
            trio.Cancelled: the mux is ended first (the batch is lost and part
                of it may be on the wire).
        """
        core = self._core
        for _ in range(_INLINE_WRITES):
            if first is not None:
                data, first = first, None
            else:
                data = core.data_to_send()
            n = len(data)
            self._writing = True
            self._writing_bytes = n
            # Shielded: the batch holds other tasks' frames too, and a write cut
            # off part-way would end the whole mux, so cancelling this sender must
            # not cut it. The write is small and the peer's reader always reads,
            # so it only blocks when the peer has stalled; the scope's own
            # deadline bounds that wait.
            deadline = trio.current_time() + _INLINE_WRITE_TIMEOUT_S
            with trio.CancelScope(shield=True, deadline=deadline) as scope:
                try:
                    await self._stream.send_all(data)
                except _STREAM_ERRORS as exc:
                    self._fail(exc, "STREAM_BROKEN", "stream broke while sending")
                    raise self._broken_error() from exc
                except trio.Cancelled:
                    raise  # only our own deadline reaches in here; handled below
                except BaseException:
                    self._terminate(
                        ChannelBroken("a send failed part-way", code="SEND_CANCELLED")
                    )
                    raise
                finally:
                    self._writing = False
                    self._writing_bytes = 0
            if scope.cancelled_caught:
                self._terminate(
                    ChannelBroken(
                        f"the peer took no data for {_INLINE_WRITE_TIMEOUT_S} s",
                        code="SEND_STALLED",
                    )
                )
                raise self._broken_error()
            self._sent(n)
            # Frames queued while we wrote: send them too (they had to wait for
            # the writer role anyway), a bounded number of times.
            queued = core.outgoing_bytes
            if not queued or self._reason is not None or queued > _INLINE_MAX_BYTES:
                break
        if core.outgoing_bytes or self._closing:
            self._kick()

    async def _writer(self) -> None:
        core = self._core
        stream = self._stream
        try:
            while True:
                handoff = self._handoff
                if handoff is not None:
                    self._handoff = None
                    # The reader left us the role with these frames.
                    if not await self._write_holding_role(stream.send_all(handoff)):
                        return
                    self._sent(len(handoff))
                    continue
                if self._flush_pending and not self._writing:
                    # What a sender's send_nowait() left in the stream goes first.
                    self._writing = True
                    flushed = await self._write_holding_role(
                        stream.flush())  # type: ignore[attr-defined]
                    self._flush_pending = False
                    if not flushed:
                        return
                    self._space_lot.unpark_all()
                    continue
                data = b"" if self._writing else core.data_to_send()
                if not data:
                    if self._closing and not self._writing:
                        self._drained.set()
                    self._writer_idle = True
                    await self._writer_lot.park()
                    # Woken by the first frame of a burst (a sender that said
                    # ``more``, or one that could not write itself): let the
                    # tasks of this pass queue theirs too, and write them all in
                    # one go.
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    continue
                n = len(data)
                send_nowait = self._send_nowait
                if send_nowait is not None:
                    # Written (or left to flush, above) without a scheduler pass.
                    try:
                        sent = send_nowait(data)
                    except _STREAM_ERRORS as exc:
                        self._fail(exc, "STREAM_BROKEN", "stream broke while sending")
                        return
                    if sent:
                        self._sent(n)
                        if stream.unflushed:  # type: ignore[attr-defined]
                            self._flush_pending = True
                            self._writing_bytes = stream.unflushed  # type: ignore[attr-defined]
                        continue
                self._writing = True
                self._writing_bytes = n
                if not await self._write_holding_role(stream.send_all(data)):
                    return
                self._sent(n)
        finally:
            self._drained.set()

    async def _write_holding_role(self, write: Awaitable[None]) -> bool:
        """Await ``write`` as the writer task holding the writer role, then give
        the role up; False if the stream broke (the mux has ended)."""
        try:
            await write
        except _STREAM_ERRORS as exc:
            self._fail(exc, "STREAM_BROKEN", "stream broke while sending")
            return False
        finally:
            self._writing = False
            self._writing_bytes = 0
        return True

    async def _reader(self) -> None:
        core = self._core
        stream = self._stream
        chunk = self.config.receive_chunk_bytes
        while True:
            try:
                data = await stream.receive_some(chunk)
            except _STREAM_ERRORS as exc:
                self._fail(exc, "STREAM_BROKEN", "stream broke while receiving")
                return
            if not data:
                self._terminate(ChannelBroken("the peer ended the stream", code="STREAM_EOF"))
                return
            self._reads += 1
            self._bytes_read += len(data)
            if self._poller is not None:
                self._poller.note_received()
            try:
                events = core.receive_data(data)
            except MuxProtocolError as exc:
                self._fail(exc, exc.code, exc.message)
                return
            if events:
                self._dispatch(events)
            # Finish pushing what this read brought before reading more.
            while self._push_later:
                if core.outgoing_bytes:
                    self._kick()
                await trio.lowlevel.cancel_shielded_checkpoint()
                later = self._push_later
                self._push_later = []
                for ch in later:
                    if ch._push(_PUSH_BURST):
                        self._push_later.append(ch)
            if core.outgoing_bytes:
                self._write_from_reader()
            # No yield here: reading again at once costs a failed recv when
            # nothing more came, and the tasks this read woke run while we wait
            # for the next read. A yield would cost a scheduler pass per read.

    def _dispatch(self, events: list[MuxEvent]) -> None:
        live = self._live
        for ev in events:
            t = type(ev)
            if t is MessageReceived:
                ch = live.get(ev.channel)  # type: ignore[union-attr]
                if ch is not None:
                    if ch._on_message is None:
                        ch._recv_lot.unpark_all()
                    elif ch._push(_PUSH_BURST):
                        # Bounded: a channel is listed once per read (its inbox
                        # went from empty to non-empty once).
                        self._push_later.append(ch)
            elif t is CreditReceived:
                ch = live.get(ev.channel)  # type: ignore[union-attr]
                if ch is not None:
                    ch._send_lot.unpark_all()
            elif t is BudgetReceived:
                waiters = self._budget_waiters
                if waiters:
                    self._budget_waiters = {}
                    for ch in waiters:
                        ch._send_lot.unpark_all()
            elif t is ChannelPaired:
                ch = live.get(ev.channel)  # type: ignore[union-attr]
                if ch is not None:
                    ch._opened.set()
            elif t is OpenRejected:
                st = ev.channel  # type: ignore[union-attr]
                ch = live.pop(st, None)
                if ch is not None:
                    reason = RejectReason(st.reject_reason).name if st.reject_reason in (
                        RejectReason._value2member_map_
                    ) else f"REJECT_{st.reject_reason}"
                    ch._open_error = ChannelRejected(
                        f"peer rejected channel {st.protocol!r}: {reason}", code=reason
                    )
                    ch._opened.set()
            elif t is ChannelIncoming:
                listener = self._listeners.get(ev.protocol)  # type: ignore[union-attr]
                if listener is not None:
                    listener._lot.unpark()
            elif t is RemoteEnded:
                ch = live.get(ev.channel)  # type: ignore[union-attr]
                if ch is not None:
                    ch._recv_lot.unpark_all()
            elif t is RemoteClosed:
                ch = live.pop(ev.channel, None)  # type: ignore[union-attr]
                if ch is not None:
                    ch._wake()

    # -- channels --------------------------------------------------------------

    async def open_channel(self, protocol: str, id: bytes = b"") -> Channel:
        """Open a channel named (protocol, id) and wait until the peer pairs it.

        The peer pairs it if it also opens (protocol, id), or if it listens for
        ``protocol``.

        Args:
            protocol: protocol name (UTF-8, at most 255 bytes).
            id: optional channel id (at most 255 bytes).

        Returns:
            The paired channel.

        Raises:
            ChannelRejected: the peer refused (``.code``: ``UNKNOWN_PROTOCOL``,
                ``TOO_MANY_CHANNELS``, ``BACKLOG_FULL``, ``DUPLICATE_CHANNEL``).
            MuxUsageError: ``DUPLICATE_CHANNEL`` if (protocol, id) is in use
                here, ``TOO_MANY_CHANNELS`` at our table bound.
            ChannelClosed / ChannelBroken: the mux ended.

        If cancelled while waiting, the open is abandoned and closed once the
        peer answers; (protocol, id) stays taken until then.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._reason is not None:
            raise self._broken_error()
        st = self._core.open(protocol, id)
        ch = Channel(self, st)
        self._live[st] = ch
        self._kick()
        try:
            await ch._opened.wait()
        except BaseException:
            ch.close_nowait()
            raise
        if ch._open_error is not None:
            raise ch._open_error
        if self._reason is not None and st.phase is not ChannelPhase.OPEN:
            raise self._broken_error()
        logger.debug(
            "mux.channel_opened mux=%s protocol=%s local=%d remote=%s",
            self.name, protocol, st.local, st.remote,
        )
        return ch

    def listen(self, protocol: str) -> ChannelListener:
        """Accept incoming opens of ``protocol`` (see :meth:`ChannelListener.accept`).

        May be called before :meth:`run`; do so for protocols the peer may open
        as soon as the connection is up, or its early opens are rejected with
        ``UNKNOWN_PROTOCOL``.

        Raises:
            MuxUsageError: ``ALREADY_LISTENING`` if ``protocol`` has a listener.
            ChannelClosed / ChannelBroken: the mux ended.
        """
        if self._reason is not None:
            raise self._broken_error()
        if protocol in self._listeners:
            raise MuxUsageError(f"already listening for {protocol!r}", code="ALREADY_LISTENING")
        listener = ChannelListener(self, protocol)
        self._listeners[protocol] = listener
        self._core.listen(protocol)
        return listener
