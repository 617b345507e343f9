"""Configuration of the secret stream."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LocalProtocolError
from ._handshake import PROLOGUE

__all__ = ["SecretStreamConfig"]

#: HyperDHT sets a 5 s keep-alive on every socket; we keep the same cadence.
DEFAULT_KEEPALIVE_INTERVAL_S = 5.0
#: Four missed keep-alives: long enough for a busy peer, short enough to free
#: the slot of a dead one quickly (upstream's users reported 5-8 s stalls).
DEFAULT_IDLE_TIMEOUT_S = 20.0
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
#: Large reads amortise the per-call cost of trio and of the frame parser during
#: bulk transfers. Reads start small, though: see SecretStream._read_more.
DEFAULT_RECEIVE_CHUNK_BYTES = 256 * 1024
#: A read of this size or more allocates its buffer with mmap() in glibc (the
#: default M_MMAP_THRESHOLD is 128 KiB), which costs ~12 us per read here even
#: when 40 bytes arrive; reads stay below it until one comes back full.
SMALL_RECEIVE_BYTES = 64 * 1024
#: A large send_all is encrypted and written in slices of this size, so memory
#: stays bounded whatever the caller passes.
DEFAULT_SEND_SLICE_BYTES = 1024 * 1024
DEFAULT_CLOSE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class SecretStreamConfig:
    """Knobs of one secret stream; validated when built."""

    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    """Seconds from the first byte to a finished handshake before it fails (TIMEOUT)."""

    keepalive_interval_s: float | None = DEFAULT_KEEPALIVE_INTERVAL_S
    """Send an empty authenticated frame after this many quiet seconds (None: never).
    Sent by :meth:`SecretStream.keep_alive`, which the owner runs in its nursery."""

    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S
    """A read that waits longer than this for any frame ends the stream (IDLE_TIMEOUT).
    None disables it. Must exceed the keep-alive interval."""

    receive_chunk_bytes: int = DEFAULT_RECEIVE_CHUNK_BYTES
    """Most bytes asked of the underlying stream per read, once reads come back
    full (bulk traffic); quiet traffic is read 64 KiB at a time."""

    send_slice_bytes: int = DEFAULT_SEND_SLICE_BYTES
    """Most plaintext bytes encrypted per write to the underlying stream."""

    close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S
    """How long aclose() may spend telling the peer the stream ended."""

    prologue: bytes = PROLOGUE
    """Protocol name and version, mixed into the handshake; must match the peer's."""

    def __post_init__(self) -> None:
        for name in ("handshake_timeout_s", "close_timeout_s"):
            if getattr(self, name) <= 0:
                raise LocalProtocolError(f"{name} must be positive")
        if self.keepalive_interval_s is not None and self.keepalive_interval_s <= 0:
            raise LocalProtocolError("keepalive_interval_s must be positive or None")
        if self.idle_timeout_s is not None:
            if self.idle_timeout_s <= 0:
                raise LocalProtocolError("idle_timeout_s must be positive or None")
            if (
                self.keepalive_interval_s is not None
                and self.idle_timeout_s <= self.keepalive_interval_s
            ):
                raise LocalProtocolError(
                    f"idle_timeout_s ({self.idle_timeout_s}) must exceed keepalive_interval_s "
                    f"({self.keepalive_interval_s}), or idle peers would time out"
                )
        if self.receive_chunk_bytes < 1024 or self.send_slice_bytes < 1024:
            raise LocalProtocolError("receive_chunk_bytes and send_slice_bytes must be >= 1024")
