"""Sans-IO RPC cores: request ids, cancellation and stream credit, without I/O.

Theory of operation
-------------------
One :class:`RpcClientCore` and one :class:`RpcServerCore` face each other over a
message channel (one RPC message per channel message, see ``_messages.py``).
Like ``h11.Connection`` they never touch a channel, task or clock: the driver
feeds each received message to :meth:`receive_message`, which returns the event
it caused (or None), and calls commands (``send_request``, ``cancel``,
``send_response`` ...), which queue encoded messages; it then collects them with
:meth:`messages_to_send` and sends them, in order, on the channel. The events
are the message classes themselves (``Request``, ``Response``, ``StreamItem``
...): what one side sends, the other receives. Nothing here parses params or
results: methods, validation and handlers belong to the drivers.

What the cores own:

* **Request ids** (client). Ids count up from 0 and wrap below 2**32, skipping
  ids still in flight. A call is in the table from its request until its final
  answer (RESPONSE, ERROR or STREAM_END) or until the client cancels it; a reply
  for an id not in the table (a late answer to a cancelled call, or a second
  answer) is dropped.
* **Calls** (server). A request is admitted into the table until the driver
  answers it (``send_response``, ``send_error``, ``send_end``) or forgets it. At
  ``max_concurrent_calls`` a further request is answered ``BUSY`` by the core
  itself: answering rather than not reading keeps CANCEL and STREAM_CREDIT
  flowing, which let running calls finish. A request reusing a running id is
  dropped (the replies would be ambiguous).
* **Cancellation.** ``RpcClientCore.cancel`` forgets the call and queues CANCEL
  (if the server may still be working on it); the server core marks the call
  cancelled and from then on drops whatever the driver answers for it: "nothing
  more is sent for that id".
* **Stream credit.** The client grants ``stream_window_items`` items in
  STREAM_REQUEST and gives credit back in batches of half the window as the
  consumer takes items (``item_taken``); an item beyond the credit fails the
  stream (event :class:`ProtocolViolation`, code ``STREAM_CREDIT_EXCEEDED``, and
  CANCEL is queued). The server core counts the credit down per item and refuses
  to queue an item without credit (:class:`RpcUsageError` ``NO_CREDIT``).
* **Bad messages.** Undecodable ones, or messages of the wrong direction, are
  counted (``bad_messages``) and dropped: one bad message ends nothing.

Bounds: the client table holds at most ``max_in_flight_calls`` calls
(``send_request`` raises ``TOO_MANY_CALLS`` beyond it: the driver waits for a
slot first); the server table at most ``max_concurrent_calls``. The output queue
is bounded by the tables: per call one request or answer, one CANCEL, and per
stream at most its credit in items and one credit grant per half window; the
server's ``BUSY`` answers are bounded only by what the client sends, so the
driver must send or drop them (the trio driver drops them when the client does
not read its replies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from p2p.rpc._config import RpcConfig
from p2p.rpc._errors import RpcProtocolError, RpcUsageError
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
    encode_fields,
    encode_message,
)

__all__ = [
    "ClientEvent",
    "ProtocolViolation",
    "RpcClientCore",
    "RpcServerCore",
    "ServerEvent",
]

_pack = encode_message
#: The unchecked encoder, for the hot paths (see _messages.encode_fields).
_fields = encode_fields


@dataclass(slots=True)
class ProtocolViolation:
    """The server broke the protocol on call ``id``; the call has ended.

    ``code`` is ``STREAM_CREDIT_EXCEEDED`` (an item beyond the credit we granted).
    """

    id: int
    code: str
    message: str


#: What :meth:`RpcClientCore.receive_message` may return.
ClientEvent = Response | Error | StreamItem | StreamEnd | ProtocolViolation
#: What :meth:`RpcServerCore.receive_message` may return.
ServerEvent = Request | StreamRequest | Cancel | StreamCredit


class _ClientStream:
    """Client-side credit of one stream."""

    __slots__ = ("outstanding", "unreported")

    def __init__(self, window: int) -> None:
        #: Items the server may still send.
        self.outstanding = window
        #: Items the consumer took that we have not yet granted back.
        self.unreported = 0


#: The table value of a unary call (streams have a _ClientStream).
_UNARY = None
#: What a table lookup returns for an id not in it.
_ABSENT: Any = object()


class RpcClientCore:
    """The client side of one RPC channel: ids, cancellation and stream credit.

    Args:
        config: ``max_in_flight_calls`` and ``stream_window_items``.

    After every command and every :meth:`receive_message`, the caller should
    send :meth:`messages_to_send` on the channel, in order.
    """

    def __init__(self, config: RpcConfig | None = None) -> None:
        self.config = config or RpcConfig()
        self._calls: dict[int, _ClientStream | None] = {}
        self._next_id = 0
        self._out: list[bytes] = []
        self._window = self.config.stream_window_items
        self._credit_batch = max(1, self._window // 2)
        self._max_calls = self.config.max_in_flight_calls
        #: Counters (see ``ClientStatistics``).
        self.calls_started = 0
        self.cancels_sent = 0
        self.bad_messages = 0

    # -- output ----------------------------------------------------------------

    def messages_to_send(self) -> list[bytes]:
        """Take the queued messages, oldest first (possibly none)."""
        out = self._out
        if out:
            self._out = []
        return out

    # -- table -----------------------------------------------------------------

    @property
    def calls_in_flight(self) -> int:
        """Calls and streams awaiting their final answer."""
        return len(self._calls)

    def is_live(self, rid: int) -> bool:
        """Whether call ``rid`` still awaits its final answer."""
        return rid in self._calls

    def _new_id(self) -> int:
        if len(self._calls) >= self._max_calls:
            raise RpcUsageError("TOO_MANY_CALLS", "max_in_flight_calls calls are in flight")
        calls = self._calls
        rid = self._next_id
        while rid in calls:  # only after 2**32 calls
            rid = rid + 1 if rid < MAX_REQUEST_ID else 0
        self._next_id = rid + 1 if rid < MAX_REQUEST_ID else 0
        self.calls_started += 1
        return rid

    # -- commands --------------------------------------------------------------

    def send_request(self, method: str, params: dict[str, Any]) -> int:
        """Queue a REQUEST for a unary call.

        Returns:
            The call's request id; a :class:`Response` or :class:`Error` with it
            comes from :meth:`receive_message`.

        Raises:
            RpcUsageError: ``TOO_MANY_CALLS`` at ``max_in_flight_calls``.
        """
        rid = self._new_id()
        self._calls[rid] = _UNARY
        self._out.append(_fields((0, rid, method, params)))
        return rid

    def send_stream_request(self, method: str, params: dict[str, Any]) -> int:
        """Queue a STREAM_REQUEST granting ``stream_window_items`` items.

        Returns:
            The stream's request id; :class:`StreamItem` events follow, then
            :class:`StreamEnd`, :class:`Error` or :class:`ProtocolViolation`.

        Raises:
            RpcUsageError: ``TOO_MANY_CALLS`` at ``max_in_flight_calls``.
        """
        rid = self._new_id()
        self._calls[rid] = _ClientStream(self._window)
        self._out.append(_pack(StreamRequest(rid, method, params, self._window)))
        return rid

    def cancel(self, rid: int) -> None:
        """Give up call ``rid``: forget it and queue CANCEL if it was still live.

        Idempotent; a call that already got its final answer is left alone.
        """
        if self._calls.pop(rid, _ABSENT) is not _ABSENT:
            self._out.append(_fields((3, rid)))
            self.cancels_sent += 1

    def item_taken(self, rid: int) -> None:
        """The consumer took one item of stream ``rid``: give credit back when due.

        Credit goes back in batches of half the window. Nothing happens for a
        stream that has ended (its items may still be being consumed).
        """
        stream = self._calls.get(rid)
        if stream is None:
            return
        unreported = stream.unreported + 1
        if unreported >= self._credit_batch:
            stream.outstanding += unreported
            self._out.append(_fields((7, rid, unreported)))
            unreported = 0
        stream.unreported = unreported

    # -- input -----------------------------------------------------------------

    def receive_message(self, data: bytes) -> ClientEvent | None:
        """Process one message from the server.

        Returns:
            The event, or None if the message was dropped: undecodable or of the
            wrong kind (counted in ``bad_messages``), or for a call no longer in
            flight. A final answer removes the call from the table.
        """
        try:
            msg = decode_message(data)
        except RpcProtocolError:
            self.bad_messages += 1
            return None
        rid = msg.id
        calls = self._calls
        stream = calls.get(rid, _ABSENT)
        if stream is _ABSENT:
            t = type(msg)
            if t is Request or t is StreamRequest or t is Cancel or t is StreamCredit:
                self.bad_messages += 1
            return None  # a late answer to a call we gave up
        t = type(msg)
        if stream is None:  # unary
            if t is Response or t is Error:
                del calls[rid]
                return msg  # type: ignore[return-value]
            self.bad_messages += 1
            return None
        if t is StreamItem:
            if stream.outstanding <= 0:  # type: ignore[union-attr]
                self.cancel(rid)
                return ProtocolViolation(
                    rid, "STREAM_CREDIT_EXCEEDED", "server sent a stream item beyond its credit"
                )
            stream.outstanding -= 1  # type: ignore[union-attr]
            return msg  # type: ignore[return-value]
        if t is StreamEnd or t is Error:
            del calls[rid]
            return msg  # type: ignore[return-value]
        self.bad_messages += 1
        return None


class _ServerCall:
    """Server-side record of one admitted call."""

    __slots__ = ("cancelled", "credit", "stream")

    def __init__(self, stream: bool, credit: int) -> None:
        self.stream = stream
        #: Items we may still send (streams).
        self.credit = credit
        #: The client sent CANCEL: nothing more goes out for this id.
        self.cancelled = False


def _too_large(what: str, message: bytes, limit: int) -> str:
    return (f"the {what} is {len(message)} bytes encoded, over the channel's limit of "
            f"{limit}: ask for less (a page, a filter)")


class RpcServerCore:
    """The server side of one RPC channel: admitted calls, cancels, stream credit.

    Args:
        config: ``max_concurrent_calls``.

    After every command and every :meth:`receive_message`, the caller should
    send :meth:`messages_to_send` on the channel, in order.
    """

    def __init__(self, config: RpcConfig | None = None) -> None:
        self.config = config or RpcConfig()
        self._calls: dict[int, _ServerCall] = {}
        self._out: list[bytes] = []
        self._max_calls = self.config.max_concurrent_calls
        #: Counters (see ``ServerStatistics``).
        self.calls_started = 0
        self.busy_replies = 0
        self.bad_messages = 0

    def messages_to_send(self) -> list[bytes]:
        """Take the queued messages, oldest first (possibly none)."""
        out = self._out
        if out:
            self._out = []
        return out

    @property
    def calls_running(self) -> int:
        """Admitted calls not yet answered or forgotten."""
        return len(self._calls)

    def is_cancelled(self, rid: int) -> bool:
        """Whether the client cancelled call ``rid`` (False if it is not running)."""
        call = self._calls.get(rid)
        return call is not None and call.cancelled

    def item_credit(self, rid: int) -> int:
        """Items stream ``rid`` may still send (0 if it is not running)."""
        call = self._calls.get(rid)
        return 0 if call is None else call.credit

    # -- input -----------------------------------------------------------------

    def receive_message(self, data: bytes) -> ServerEvent | None:
        """Process one message from the client.

        Returns:
            ``Request`` / ``StreamRequest``: a call was admitted; the driver
            runs it and must answer it (or :meth:`forget` it).
            ``Cancel``: the client cancelled a running call; stop its handler.
            ``StreamCredit``: a running stream got more credit.
            None: the message was dropped (undecodable or of the wrong kind:
            counted in ``bad_messages``; a duplicate id; a CANCEL or credit for a
            call not running) or answered ``BUSY`` by the core (queued).
        """
        try:
            msg = decode_message(data)
        except RpcProtocolError:
            self.bad_messages += 1
            return None
        t = type(msg)
        rid = msg.id
        calls = self._calls
        if t is Request or t is StreamRequest:
            if rid in calls:
                self.bad_messages += 1  # a duplicate id would make replies ambiguous
                return None
            if len(calls) >= self._max_calls:
                self.busy_replies += 1
                busy = Error(rid, "BUSY", "too many concurrent calls; retry later")
                self._out.append(_pack(busy))
                return None
            if t is StreamRequest:
                calls[rid] = _ServerCall(True, msg.credit)  # type: ignore[union-attr]
            else:
                calls[rid] = _ServerCall(False, 0)
            self.calls_started += 1
            return msg  # type: ignore[return-value]
        if t is Cancel:
            call = calls.get(rid)
            if call is None or call.cancelled:
                return None
            call.cancelled = True
            return msg  # type: ignore[return-value]
        if t is StreamCredit:
            call = calls.get(rid)
            if call is None or not call.stream:
                return None
            call.credit += msg.credit  # type: ignore[union-attr]
            return msg  # type: ignore[return-value]
        self.bad_messages += 1  # a reply type sent to the server
        return None

    # -- commands --------------------------------------------------------------

    def _finish(self, rid: int) -> _ServerCall:
        call = self._calls.pop(rid, None)
        if call is None:
            raise RpcUsageError("NOT_RUNNING", f"call {rid} is not running")
        return call

    def send_response(self, rid: int, result: dict[str, Any], *,
                      max_bytes: int | None = None) -> None:
        """Queue the RESPONSE of unary call ``rid`` (nothing if it was cancelled); it ends.

        A response over ``max_bytes`` (what the channel can carry) becomes the
        error ``RESULT_TOO_LARGE`` for that call alone: sending it would fail,
        and a failed send ends the channel and every other call on it.

        Raises:
            RpcUsageError: ``NOT_RUNNING`` if ``rid`` is not running.
        """
        if self._finish(rid).cancelled:
            return
        message = _fields((1, rid, result))
        if max_bytes is not None and len(message) > max_bytes:
            message = _pack(Error(rid, "RESULT_TOO_LARGE", _too_large("result", message,
                                                                       max_bytes)))
        self._out.append(message)

    def send_error(self, rid: int, code: str, message: str, data: Any = None) -> None:
        """Queue an ERROR ending call or stream ``rid`` (nothing if it was cancelled).

        Raises:
            RpcUsageError: ``NOT_RUNNING`` if ``rid`` is not running.
        """
        if not self._finish(rid).cancelled:
            self._out.append(_pack(Error(rid, code, message, data)))

    def send_item(self, rid: int, item: dict[str, Any], *,
                  max_bytes: int | None = None) -> bool:
        """Queue one STREAM_ITEM of stream ``rid``, using one item of credit.

        Dropped (the credit still used) if the client cancelled the stream. An
        item over ``max_bytes`` ends the stream with ``RESULT_TOO_LARGE``: then
        False is returned (send nothing more on it), else True.

        Raises:
            RpcUsageError: ``NOT_RUNNING`` if ``rid`` is not a running stream,
                ``NO_CREDIT`` if it has no credit (wait for a ``StreamCredit``).
        """
        call = self._calls.get(rid)
        if call is None or not call.stream:
            raise RpcUsageError("NOT_RUNNING", f"stream {rid} is not running")
        if call.credit <= 0:
            raise RpcUsageError("NO_CREDIT", f"stream {rid} has no item credit")
        call.credit -= 1  # also when dropped: the credit rule does not depend on it
        if call.cancelled:
            return True
        message = _fields((5, rid, item))
        if max_bytes is not None and len(message) > max_bytes:
            # Ends this stream alone (as send_response does a call).
            self._finish(rid)
            self._out.append(_pack(Error(rid, "RESULT_TOO_LARGE", _too_large(
                "stream item", message, max_bytes))))
            return False
        self._out.append(message)
        return True

    def send_end(self, rid: int) -> None:
        """Queue STREAM_END: stream ``rid`` ended normally (nothing if cancelled).

        Raises:
            RpcUsageError: ``NOT_RUNNING`` if ``rid`` is not running.
        """
        if not self._finish(rid).cancelled:
            self._out.append(_pack(StreamEnd(rid)))

    def forget(self, rid: int) -> None:
        """End call ``rid`` without an answer (the channel is gone). Idempotent."""
        self._calls.pop(rid, None)
