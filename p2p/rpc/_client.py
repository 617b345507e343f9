"""RPC client: the trio driver of :class:`~p2p.rpc._core.RpcClientCore`.

Theory of operation
-------------------
The core owns request ids, cancellation and stream credit; this driver owns the
waiting. Each call takes a slot (at most ``max_in_flight_calls``; callers wait
for room), has the core queue its request and sends it from the calling task,
then parks on its :class:`_Slot` until the reply arrives. Replies are fed to the
core by :meth:`RpcClient._on_message`; on a mux channel that runs in the mux's
reader task as each reply is parsed (push delivery: the waiting caller is woken
straight from the reader, one task switch per reply); on other channels
:meth:`RpcClient.run` pulls messages and calls it.

Messages the core queues outside a caller's own send (CANCEL of a timed-out or
cancelled call, STREAM_CREDIT as a consumer takes items, CANCEL of a stream
whose server broke the credit rule) are handed to the channel at once with
``send_nowait``; if the channel cannot take one now they wait, in order, for the
flusher task that :meth:`run` owns. A cancelled task can thus always cancel its
call: it never has to ``await`` a send.

When the channel ends every call in flight fails with :class:`RpcChannelClosed`.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pydantic
import trio

from p2p.mux import Channel as MuxChannel
from p2p.rpc._config import RpcConfig
from p2p.rpc._core import ProtocolViolation, RpcClientCore
from p2p.rpc._errors import (
    RpcChannelClosed,
    RpcError,
    RpcProtocolError,
    RpcTimeout,
    RpcUsageError,
)
from p2p.rpc._messages import Error, Response, StreamEnd, StreamItem
from p2p.rpc._method import Method, StreamMethod
from p2p.rpc._models import dump, validate
from p2p.rpc._sending import Outbox, deliver_messages, send_bytes

__all__ = ["ClientStatistics", "ItemStream", "RpcClient"]

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=pydantic.BaseModel)
R = TypeVar("R", bound=pydantic.BaseModel)
I = TypeVar("I", bound=pydantic.BaseModel)  # noqa: E741

_CHANNEL_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """A snapshot of a client's counters."""

    calls_in_flight: int
    calls_started: int
    timeouts: int
    cancels_sent: int
    bad_messages: int


class _Slot:
    """One call in flight: what the reader delivers to the waiting caller.

    A one-shot event without the ParkingLot of ``trio.Event``: the caller parks
    with ``wait_task_rescheduled`` and :meth:`resolve` reschedules it.
    """

    __slots__ = ("done", "error", "result", "task")

    def __init__(self) -> None:
        self.done = False
        self.result: Any = None
        self.error: RpcError | None = None
        self.task: trio.lowlevel.Task | None = None

    def resolve(self) -> None:
        self.done = True
        task = self.task
        if task is not None:
            self.task = None
            trio.lowlevel.reschedule(task)

    def _abort(self, raise_cancel: object) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> None:
        # A checkpoint: the caller always sent its request just before, which
        # either yielded (an inline write) or queued without yielding, so a
        # reply can only be here already after a yield.
        if self.done:
            await trio.lowlevel.checkpoint()
            return
        self.task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)


class _StreamSlot:
    __slots__ = ("done", "error", "items", "lot")

    def __init__(self) -> None:
        #: Bounded by the credit the core grants (``stream_window_items``).
        self.items: deque[dict[str, Any]] = deque()
        self.done = False
        self.error: RpcError | None = None
        self.lot = trio.lowlevel.ParkingLot()

    def finish(self, error: RpcError | None) -> None:
        if not self.done:
            self.error = error
            self.done = True
            self.lot.unpark_all()


def _params_payload(method: Method | StreamMethod, params: Any) -> dict[str, Any]:
    if type(params) is not method.params:
        try:
            params = validate(method.params, params)
        except pydantic.ValidationError as exc:
            raise RpcUsageError("BAD_PARAMS", f"params for {method.name!r}: {exc}") from exc
    return dump(params)


class RpcClient:
    """Calls methods on the server at the other end of ``channel``.

    Args:
        channel: any :class:`trio.abc.Channel` of bytes (a mux channel).
        config: limits and the stream window.
        name: names this client in logs.

    Start :meth:`run` in a nursery you own before calling:
    ``await nursery.start(client.run)``.
    """

    def __init__(
        self,
        channel: trio.abc.Channel[bytes],
        *,
        config: RpcConfig | None = None,
        name: str = "rpc-client",
    ) -> None:
        self._channel = channel
        #: ``send(data, *, checkpoint, more)``: a mux channel's own, else send_bytes.
        self._send = (
            channel.send if type(channel) is MuxChannel else functools.partial(send_bytes, channel)
        )
        self.config = config or RpcConfig()
        self.name = name
        self._core = RpcClientCore(self.config)
        #: Waiting callers and streams by request id (the core's table, plus
        #: calls whose answer is in but whose caller has not yet woken).
        self._waiting: dict[int, _Slot | _StreamSlot] = {}
        self._slots = trio.Semaphore(self.config.max_in_flight_calls)
        # Bounded: CANCEL and STREAM_CREDIT, at most one of each per call in
        # flight plus one credit grant per half window per stream.
        self._outbox = Outbox(channel)
        self._closed: RpcChannelClosed | None = None
        self._run_scope: trio.CancelScope | None = None
        self._timeouts = 0

    def statistics(self) -> ClientStatistics:
        """Return a snapshot of the client's counters."""
        core = self._core
        return ClientStatistics(
            calls_in_flight=len(self._waiting),
            calls_started=core.calls_started,
            timeouts=self._timeouts,
            cancels_sent=core.cancels_sent,
            bad_messages=core.bad_messages,
        )

    # -- lifetime --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read replies until the channel ends, then fail every call in flight.

        Returns when the channel ends or :meth:`aclose` is called.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._run_scope = nursery.cancel_scope
                nursery.start_soon(self._outbox.run)
                task_status.started()
                await self._read_loop()
                nursery.cancel_scope.cancel()
        finally:
            self._fail_all(RpcChannelClosed("CHANNEL_CLOSED", "the RPC channel ended"))

    async def aclose(self) -> None:
        """Close the channel; calls in flight fail with ``CHANNEL_CLOSED``."""
        self._fail_all(RpcChannelClosed("CHANNEL_CLOSED", "the RPC client was closed"))
        if self._run_scope is not None:
            self._run_scope.cancel()
        await trio.aclose_forcefully(self._channel)

    def _fail_all(self, error: RpcChannelClosed) -> None:
        if self._closed is None:
            self._closed = error
        self._outbox.close()
        for slot in self._waiting.values():
            if isinstance(slot, _Slot):
                if not slot.done:
                    slot.error = error
                    slot.resolve()
            else:
                slot.finish(error)

    def _closed_error(self) -> RpcChannelClosed:
        assert self._closed is not None
        return RpcChannelClosed("CHANNEL_CLOSED", self._closed.message)

    async def _read_loop(self) -> None:
        await deliver_messages(self._channel, self._on_message, logger=logger, name=self.name)

    def _on_message(self, data: bytes) -> None:
        """Hand one reply to its call (synchronous; may run in the mux reader)."""
        ev = self._core.receive_message(data)
        if ev is None:
            return
        slot = self._waiting.get(ev.id)
        if slot is None:  # cannot happen: the core's table is within ours
            return
        t = type(ev)
        if t is Response:
            slot.result = ev.result  # type: ignore[union-attr]
            slot.resolve()  # type: ignore[union-attr]
        elif t is StreamItem:
            slot.items.append(ev.item)  # type: ignore[union-attr]
            slot.lot.unpark_all()  # type: ignore[union-attr]
        elif t is Error:
            error = RpcError(ev.code, ev.message, ev.data)  # type: ignore[union-attr]
            if type(slot) is _Slot:
                slot.error = error
                slot.resolve()
            else:
                slot.finish(error)  # type: ignore[union-attr]
        elif t is StreamEnd:
            slot.finish(None)  # type: ignore[union-attr]
        elif t is ProtocolViolation:
            slot.finish(RpcProtocolError(ev.code, ev.message))  # type: ignore[union-attr]
            self._outbox.put(self._core.messages_to_send())  # the CANCEL

    # -- calls -----------------------------------------------------------------

    async def _acquire_slot(self) -> None:
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()

    def _give_up(self, rid: int) -> None:
        """Forget call ``rid``; if it was live, its CANCEL goes out without waiting."""
        core = self._core
        core.cancel(rid)
        self._outbox.put(core.messages_to_send())

    async def call(self, method: Method[P, R], params: P, *, timeout_s: float | None = None) -> R:
        """Call ``method`` and wait for its validated result.

        Args:
            method: the declaration shared with the server.
            params: an instance of ``method.params`` (a dict is validated into one).
            timeout_s: give up after this many seconds (trio clock) and tell the
                server to cancel the handler; None waits forever.

        Returns:
            An instance of ``method.result``.

        Raises:
            RpcError: the server answered with an error (``.code``).
            RpcTimeout: ``TIMEOUT``.
            RpcChannelClosed: ``CHANNEL_CLOSED``; the channel ended first.
            RpcProtocolError: ``INVALID_RESULT``; the result failed validation.
            RpcUsageError: ``BAD_PARAMS``; ``params`` failed validation locally.

        If the calling task is cancelled, CANCEL is sent so the server stops too.
        """
        if self._closed is not None:
            await trio.lowlevel.checkpoint()
            raise self._closed_error()
        payload = _params_payload(method, params)
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        core = self._core
        # No checkpoint from here to the send: the request is queued in the
        # core and handed to the channel in one step.
        rid = core.send_request(method.name, payload)
        slot = _Slot()
        self._waiting[rid] = slot
        timed_out = False
        try:
            (request,) = core.messages_to_send()
            if timeout_s is None:  # no cancel scope: it costs ~10% of a call
                # _send_request and _Slot.wait, inlined (once per call).
                try:
                    await self._send(request, checkpoint=False, more=len(self._waiting) > 1)
                except _CHANNEL_GONE as exc:
                    raise RpcChannelClosed("CHANNEL_CLOSED", "the RPC channel ended") from exc
                if slot.done:
                    await trio.lowlevel.checkpoint()
                else:
                    slot.task = trio.lowlevel.current_task()
                    await trio.lowlevel.wait_task_rescheduled(slot._abort)
            else:
                with trio.move_on_after(timeout_s) as cs:
                    await self._send_request(request, slot)
                timed_out = cs.cancelled_caught and not slot.done
        finally:
            del self._waiting[rid]
            self._slots.release()
            if not slot.done:
                # Timed out, or our task was cancelled: tell the server to stop.
                self._give_up(rid)
        if timed_out:
            self._timeouts += 1
            raise RpcTimeout("TIMEOUT", f"{method.name!r} got no answer in {timeout_s} s")
        if slot.error is not None:
            raise slot.error
        try:
            return validate(method.result, slot.result)
        except pydantic.ValidationError as exc:
            raise RpcProtocolError(
                "INVALID_RESULT", f"result of {method.name!r} failed validation: {exc}"
            ) from exc

    async def _send_request(self, request: bytes, slot: _Slot) -> None:
        try:
            # No checkpoint of its own: waiting for the reply is one. With other
            # calls in flight, more requests are likely to follow this pass:
            # leave ours to the mux writer's batch.
            await self._send(request, checkpoint=False, more=len(self._waiting) > 1)
        except _CHANNEL_GONE as exc:
            raise RpcChannelClosed("CHANNEL_CLOSED", "the RPC channel ended") from exc
        await slot.wait()

    @asynccontextmanager
    async def stream(self, method: StreamMethod[P, I], params: P) -> AsyncIterator[ItemStream[I]]:
        """Start a server-streamed call; iterate the yielded :class:`ItemStream`.

        Leaving the block before the stream ended cancels the server's handler.

        Raises:
            RpcChannelClosed: the channel ended.
            RpcUsageError: ``params`` failed validation locally.
        """
        if self._closed is not None:
            await trio.lowlevel.checkpoint()
            raise self._closed_error()
        payload = _params_payload(method, params)
        await self._acquire_slot()
        core = self._core
        rid = core.send_stream_request(method.name, payload)
        slot = _StreamSlot()
        self._waiting[rid] = slot
        try:
            (request,) = core.messages_to_send()
            try:
                await send_bytes(self._channel, request)
            except _CHANNEL_GONE as exc:
                raise RpcChannelClosed("CHANNEL_CLOSED", "the RPC channel ended") from exc
            yield ItemStream(self, method, rid, slot)
        finally:
            del self._waiting[rid]
            self._slots.release()
            if not slot.done:
                self._give_up(rid)


class ItemStream(Generic[I]):
    """The items of one server-streamed call; ``async for item in items``."""

    def __init__(self, client: RpcClient, method: StreamMethod, rid: int, slot: _StreamSlot):
        self._client = client
        self._method = method
        self._rid = rid
        self._slot = slot

    def __aiter__(self) -> ItemStream[I]:
        return self

    async def __anext__(self) -> I:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def receive(self) -> I:
        """Wait for the next item.

        Raises:
            trio.EndOfChannel: the stream ended normally.
            RpcError: the server answered with an error (any time in the stream).
            RpcChannelClosed: the channel ended.
        """
        slot = self._slot
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while not slot.items:
            if slot.done:
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                if slot.error is not None:
                    raise slot.error
                raise trio.EndOfChannel
            await slot.lot.park()
            waited = True
        item = self._take()
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return item

    def receive_nowait(self) -> I:
        """The next item if one has arrived already, without waiting or yielding.

        For a consumer that writes several items at once (one socket write for
        what arrived together) after an awaited :meth:`receive`.

        Raises:
            trio.WouldBlock: no item is here yet (and the stream has not ended).
            trio.EndOfChannel, RpcError, RpcChannelClosed: as :meth:`receive`.
        """
        slot = self._slot
        if not slot.items:
            if not slot.done:
                raise trio.WouldBlock
            if slot.error is not None:
                raise slot.error
            raise trio.EndOfChannel
        return self._take()

    def _take(self) -> I:
        raw = self._slot.items.popleft()
        client = self._client
        # Credit goes back as items are taken (the core batches it); handed to
        # the channel without waiting, so a cancelled consumer loses nothing.
        client._core.item_taken(self._rid)
        client._outbox.put(client._core.messages_to_send())
        try:
            return validate(self._method.item, raw)
        except pydantic.ValidationError as exc:
            raise RpcProtocolError(
                "INVALID_RESULT", f"item of {self._method.name!r} failed validation: {exc}"
            ) from exc
