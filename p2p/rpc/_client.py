"""RPC client: calls methods over one mux channel.

Theory of operation
-------------------
:meth:`RpcClient.run` owns the canceller task, which sends CANCEL for calls
that timed out or were cancelled (a cancelled task cannot ``await`` a send
itself), and waits for the channel to end. Replies are handled by
:meth:`RpcClient._on_message`, which hands each to the waiting call by request
id. On a mux channel it runs in the mux's reader task as each reply is parsed
(push delivery: the waiting caller is woken straight from the reader, one task
switch per reply); on other channels ``run`` pulls messages and calls it. Each
call registers a slot in a table bounded by ``max_in_flight_calls`` (callers
wait for room), sends its request and waits on its slot. Replies for ids no
longer in the table (late answers to cancelled calls) are dropped.

Streams: the client grants the server ``stream_window_items`` items of credit in
STREAM_REQUEST and returns credit in batches of half the window as the consumer
takes items, so at most a window of items is buffered per stream and a slow
consumer never stalls the reader (other calls keep flowing). A server that sends
beyond its credit fails that stream with ``STREAM_CREDIT_EXCEEDED``.

When the channel ends every call in flight fails with :class:`RpcChannelClosed`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pydantic
import trio

from p2p.rpc._config import RpcConfig
from p2p.rpc._errors import (
    RpcChannelClosed,
    RpcError,
    RpcProtocolError,
    RpcTimeout,
    RpcUsageError,
)
from p2p.rpc._messages import (
    MAX_REQUEST_ID,
    Cancel,
    Error,
    Request,
    Response,
    StreamCredit,
    StreamEnd,
    StreamItem,
    StreamRequest,
    decode_message,
    encode_message,
)
from p2p.rpc._method import Method, StreamMethod
from p2p.rpc._sending import deliver_messages, send_bytes

__all__ = ["ClientStatistics", "ItemStream", "RpcClient"]

logger = logging.getLogger(__name__)

P = TypeVar("P", bound=pydantic.BaseModel)
R = TypeVar("R", bound=pydantic.BaseModel)
I = TypeVar("I", bound=pydantic.BaseModel)  # noqa: E741


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
    __slots__ = ("credit_outstanding", "done", "error", "items", "lot", "unreported")

    def __init__(self, credit: int) -> None:
        self.items: deque[dict[str, Any]] = deque()
        self.done = False
        self.error: RpcError | None = None
        self.lot = trio.lowlevel.ParkingLot()
        self.credit_outstanding = credit
        self.unreported = 0


def _params_payload(method: Method | StreamMethod, params: Any) -> dict[str, Any]:
    if type(params) is not method.params:
        try:
            params = method.params.model_validate(params)
        except pydantic.ValidationError as exc:
            raise RpcUsageError("BAD_PARAMS", f"params for {method.name!r}: {exc}") from exc
    return params.model_dump(mode="python")


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
        self.config = config or RpcConfig()
        self.name = name
        self._calls: dict[int, _Slot | _StreamSlot] = {}
        self._next_id = 0
        self._slots = trio.Semaphore(self.config.max_in_flight_calls)
        self._cancels: list[int] = []
        self._cancel_lot = trio.lowlevel.ParkingLot()
        self._closed: RpcChannelClosed | None = None
        self._run_scope: trio.CancelScope | None = None
        self._calls_started = 0
        self._timeouts = 0
        self._cancels_sent = 0
        self._bad = 0

    def statistics(self) -> ClientStatistics:
        """Return a snapshot of the client's counters."""
        return ClientStatistics(
            calls_in_flight=len(self._calls),
            calls_started=self._calls_started,
            timeouts=self._timeouts,
            cancels_sent=self._cancels_sent,
            bad_messages=self._bad,
        )

    # -- lifetime --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read replies until the channel ends, then fail every call in flight.

        Returns when the channel ends or :meth:`aclose` is called.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._run_scope = nursery.cancel_scope
                nursery.start_soon(self._canceller)
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
        for slot in self._calls.values():
            if isinstance(slot, _Slot):
                if not slot.done:
                    slot.error = error
                    slot.resolve()
            elif not slot.done:
                slot.error = error
                slot.done = True
                slot.lot.unpark_all()

    def _closed_error(self) -> RpcChannelClosed:
        assert self._closed is not None
        return RpcChannelClosed("CHANNEL_CLOSED", self._closed.message)

    async def _read_loop(self) -> None:
        await deliver_messages(self._channel, self._on_message, logger=logger, name=self.name)

    def _on_message(self, data: bytes) -> None:
        """Hand one reply to its call (synchronous; may run in the mux reader)."""
        try:
            msg = decode_message(data)
        except RpcProtocolError as exc:
            self._bad += 1
            logger.debug("rpc.client.bad_message client=%s code=%s", self.name, exc.code)
            return
        slot = self._calls.get(msg.id)
        if slot is None:
            return  # a late answer to a call that timed out or was cancelled
        t = type(msg)
        if type(slot) is _Slot:
            if slot.done:
                self._bad += 1  # a second answer
                return
            if t is Response:
                slot.result = msg.result  # type: ignore[union-attr]
            elif t is Error:
                slot.error = RpcError(msg.code, msg.message, msg.data)  # type: ignore[union-attr]
            else:
                self._bad += 1
                return
            slot.resolve()
            return
        assert isinstance(slot, _StreamSlot)
        if slot.done:
            return
        if t is StreamItem:
            if slot.credit_outstanding <= 0:
                slot.error = RpcProtocolError(
                    "STREAM_CREDIT_EXCEEDED", "server sent a stream item beyond its credit"
                )
                slot.done = True
                self._queue_cancel(msg.id)
            else:
                # Bounded by the credit we granted (stream_window_items).
                slot.credit_outstanding -= 1
                slot.items.append(msg.item)  # type: ignore[union-attr]
        elif t is StreamEnd:
            slot.done = True
        elif t is Error:
            slot.error = RpcError(msg.code, msg.message, msg.data)  # type: ignore[union-attr]
            slot.done = True
        else:
            self._bad += 1
            return
        slot.lot.unpark_all()

    def _queue_cancel(self, rid: int) -> None:
        # Bounded: at most one CANCEL per call in flight.
        if self._closed is None:
            self._cancels.append(rid)
            self._cancel_lot.unpark()

    async def _canceller(self) -> None:
        while True:
            if not self._cancels:
                await self._cancel_lot.park()
                continue
            rid = self._cancels.pop(0)
            try:
                # more=True: never written from this task, so closing the client
                # (which cancels it) cannot cut a write short and end the mux.
                await send_bytes(self._channel, encode_message(Cancel(rid)), more=True)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            self._cancels_sent += 1

    # -- calls -----------------------------------------------------------------

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1 if rid < MAX_REQUEST_ID else 0
        while self._next_id in self._calls:  # only after 2**32 calls
            self._next_id = self._next_id + 1 if self._next_id < MAX_REQUEST_ID else 0
        return rid

    async def _acquire_slot(self) -> None:
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()

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
        await self._acquire_slot()
        rid = self._new_id()
        slot = _Slot()
        self._calls[rid] = slot
        self._calls_started += 1
        timed_out = False
        try:
            request = encode_message(Request(rid, method.name, payload))
            if timeout_s is None:  # no cancel scope: it costs ~10% of a call
                await self._send_request(request, slot)
            else:
                with trio.move_on_after(timeout_s) as cs:
                    await self._send_request(request, slot)
                timed_out = cs.cancelled_caught and not slot.done
        finally:
            del self._calls[rid]
            self._slots.release()
            if not slot.done:
                # Timed out, or our task was cancelled: tell the server to stop.
                self._queue_cancel(rid)
        if timed_out:
            self._timeouts += 1
            raise RpcTimeout("TIMEOUT", f"{method.name!r} got no answer in {timeout_s} s")
        if slot.error is not None:
            raise slot.error
        try:
            return method.result.model_validate(slot.result)
        except pydantic.ValidationError as exc:
            raise RpcProtocolError(
                "INVALID_RESULT", f"result of {method.name!r} failed validation: {exc}"
            ) from exc

    async def _send_request(self, request: bytes, slot: _Slot) -> None:
        try:
            # No checkpoint of its own: waiting for the reply is one. With other
            # calls in flight, more requests are likely to follow this pass:
            # leave ours to the mux writer's batch.
            await send_bytes(
                self._channel, request, checkpoint=False, more=len(self._calls) > 1
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
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
        rid = self._new_id()
        window = self.config.stream_window_items
        slot = _StreamSlot(window)
        self._calls[rid] = slot
        self._calls_started += 1
        try:
            try:
                await send_bytes(
                    self._channel, encode_message(StreamRequest(rid, method.name, payload, window))
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise RpcChannelClosed("CHANNEL_CLOSED", "the RPC channel ended") from exc
            yield ItemStream(self, method, rid, slot)
        finally:
            if not slot.done:
                self._queue_cancel(rid)
            del self._calls[rid]
            self._slots.release()


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
        while not slot.items:
            if slot.done:
                await trio.lowlevel.cancel_shielded_checkpoint()
                if slot.error is not None:
                    raise slot.error
                raise trio.EndOfChannel
            await slot.lot.park()
        window = self._client.config.stream_window_items
        if slot.unreported + 1 >= max(1, window // 2) and not slot.done:
            # Return credit for this item and the unreported ones before taking
            # it, so a cancelled send leaves both the item and the counts as
            # they were.
            grant = slot.unreported + 1
            slot.credit_outstanding += grant
            try:
                # more=True: queued for the mux writer, never written from this
                # task, so cancelling the consumer cannot cut a write short.
                await send_bytes(
                    self._client._channel,
                    encode_message(StreamCredit(self._rid, grant)),
                    more=True,
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the reader will see the channel end and fail the stream
            except BaseException:
                slot.credit_outstanding -= grant
                raise
            slot.unreported = 0
        else:
            slot.unreported += 1
            await trio.lowlevel.cancel_shielded_checkpoint()
        raw = slot.items.popleft()
        try:
            return self._method.item.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise RpcProtocolError(
                "INVALID_RESULT", f"item of {self._method.name!r} failed validation: {exc}"
            ) from exc
