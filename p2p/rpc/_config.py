"""Configuration of RPC clients and servers."""

from __future__ import annotations

from dataclasses import dataclass

from p2p.rpc._errors import RpcUsageError

__all__ = ["RpcConfig"]

#: protomux-rpc has no limit; HTTP/2 servers commonly allow 100-256 streams.
DEFAULT_MAX_CONCURRENT_CALLS = 256
DEFAULT_MAX_IN_FLIGHT_CALLS = 256
#: Items a stream consumer lets the server send ahead (gRPC-style small window).
DEFAULT_STREAM_WINDOW_ITEMS = 16


@dataclass(frozen=True, slots=True)
class RpcConfig:
    """Limits of one RPC client or server; validated when built.

    Raises:
        RpcUsageError: (code ``BAD_CONFIG``) if a field is not a positive int.
    """

    max_concurrent_calls: int = DEFAULT_MAX_CONCURRENT_CALLS
    """Server: handler tasks running at once per connection. A request beyond it
    is answered at once with code ``BUSY`` (the reader never stops reading, so
    CANCEL and STREAM_CREDIT messages always get through)."""

    max_in_flight_calls: int = DEFAULT_MAX_IN_FLIGHT_CALLS
    """Client: calls and streams awaiting answers. At the bound, ``call()`` and
    ``stream()`` wait for a slot."""

    stream_window_items: int = DEFAULT_STREAM_WINDOW_ITEMS
    """Client: stream items the server may send ahead of the consumer. Credit is
    returned in batches of half the window; at most this many items are buffered
    per stream."""

    def __post_init__(self) -> None:
        for name in ("max_concurrent_calls", "max_in_flight_calls", "stream_window_items"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise RpcUsageError("BAD_CONFIG", f"{name} must be a positive int, got {value!r}")
