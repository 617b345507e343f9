"""Wire messages of the RPC layer and their msgpack codec.

Each mux channel message carries exactly one RPC message: a msgpack array whose
first element is a small int type and whose second is the request id (an
unsigned int < 2**32 chosen by the client; every reply echoes it)::

    REQUEST         [0, id, method: str, params: map]
    RESPONSE        [1, id, result: map]
    ERROR           [2, id, code: str, message: str, data: any | nil]
    CANCEL          [3, id]
    STREAM_REQUEST  [4, id, method: str, params: map, credit: uint]
    STREAM_ITEM     [5, id, item: map]
    STREAM_END      [6, id]
    STREAM_CREDIT   [7, id, credit: uint]

Client -> server: REQUEST, STREAM_REQUEST, CANCEL, STREAM_CREDIT.
Server -> client: RESPONSE, ERROR, STREAM_ITEM, STREAM_END.

``credit`` counts stream items the server may still send. Strings are msgpack
str (UTF-8), bytes are bin. :func:`decode_message` raises only
:class:`RpcProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from p2p.rpc._errors import RpcProtocolError

__all__ = [
    "MAX_REQUEST_ID",
    "Cancel",
    "Error",
    "Request",
    "Response",
    "RpcMessage",
    "StreamCredit",
    "StreamEnd",
    "StreamItem",
    "StreamRequest",
    "decode_message",
    "encode_fields",
    "encode_message",
]

MAX_REQUEST_ID = (1 << 32) - 1
_MAX_CREDIT = (1 << 32) - 1


@dataclass(slots=True)
class Request:
    id: int
    method: str
    params: dict[str, Any]


@dataclass(slots=True)
class Response:
    id: int
    result: dict[str, Any]


@dataclass(slots=True)
class Error:
    id: int
    code: str
    message: str
    data: Any = None


@dataclass(slots=True)
class Cancel:
    id: int


@dataclass(slots=True)
class StreamRequest:
    id: int
    method: str
    params: dict[str, Any]
    credit: int


@dataclass(slots=True)
class StreamItem:
    id: int
    item: dict[str, Any]


@dataclass(slots=True)
class StreamEnd:
    id: int


@dataclass(slots=True)
class StreamCredit:
    id: int
    credit: int


RpcMessage = (
    Request | Response | Error | Cancel | StreamRequest | StreamItem | StreamEnd | StreamCredit
)

_packer = msgpack.Packer(use_bin_type=True, autoreset=True)
_pack = _packer.pack


def encode_fields(fields: tuple[Any, ...]) -> bytes:
    """Encode a message given as its array (``(type, id, ...)``, as drawn above).

    The hot path of the cores: no message object is built. The caller
    guarantees the shape; :func:`encode_message` is the checked way.
    """
    return _pack(fields)


def encode_message(msg: RpcMessage) -> bytes:
    """Encode one message as a msgpack array.

    Raises:
        TypeError: a field holds something msgpack cannot encode (a local bug).
    """
    t = type(msg)
    if t is Request:
        return _pack((0, msg.id, msg.method, msg.params))
    if t is Response:
        return _pack((1, msg.id, msg.result))
    if t is Error:
        return _pack((2, msg.id, msg.code, msg.message, msg.data))
    if t is Cancel:
        return _pack((3, msg.id))
    if t is StreamRequest:
        return _pack((4, msg.id, msg.method, msg.params, msg.credit))
    if t is StreamItem:
        return _pack((5, msg.id, msg.item))
    if t is StreamEnd:
        return _pack((6, msg.id))
    if t is StreamCredit:
        return _pack((7, msg.id, msg.credit))
    raise TypeError(f"not an RPC message: {msg!r}")


# (type, length) of each well-formed array.
_LENGTHS = {0: 4, 1: 3, 2: 5, 3: 2, 4: 5, 5: 3, 6: 2, 7: 3}


def _bad(message: str) -> RpcProtocolError:
    return RpcProtocolError("BAD_MESSAGE", message)


def decode_message(data: bytes) -> RpcMessage:
    """Decode one message.

    Raises:
        RpcProtocolError: ``DECODE_ERROR`` (not msgpack) or ``BAD_MESSAGE``
            (msgpack, but not a well-formed RPC message).
    """
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types; translate them once here
        raise RpcProtocolError("DECODE_ERROR", f"not msgpack: {exc}") from exc
    if type(obj) is not list or len(obj) < 2:
        raise _bad("message is not an array of at least two items")
    t = obj[0]
    rid = obj[1]
    if type(t) is not int or _LENGTHS.get(t) != len(obj):
        raise _bad(f"unknown type or wrong length: type={t!r} length={len(obj)}")
    if type(rid) is not int or not 0 <= rid <= MAX_REQUEST_ID:
        raise _bad("request id must be an unsigned 32-bit int")
    if t == 1:
        return Response(rid, _map(obj[2], "result"))
    if t == 0:
        return Request(rid, _str(obj[2], "method"), _map(obj[3], "params"))
    if t == 5:
        return StreamItem(rid, _map(obj[2], "item"))
    if t == 2:
        return Error(rid, _str(obj[2], "code"), _str(obj[3], "message"), obj[4])
    if t == 3:
        return Cancel(rid)
    if t == 4:
        return StreamRequest(
            rid, _str(obj[2], "method"), _map(obj[3], "params"), _credit(obj[4])
        )
    if t == 6:
        return StreamEnd(rid)
    return StreamCredit(rid, _credit(obj[2]))


def _str(value: Any, field: str) -> str:
    if type(value) is not str:
        raise _bad(f"{field} must be a str")
    return value


def _map(value: Any, field: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _bad(f"{field} must be a map")
    return value


def _credit(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_CREDIT:
        raise _bad("credit must be an unsigned 32-bit int")
    return value
