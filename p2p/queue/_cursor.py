"""A durable position (the consumer's ack cursor): two checksummed slots.

Each write goes to the slot the last one did not use, so a write torn by a
crash leaves the other slot whole; opening takes the highest position among
the slots whose checksum holds. Positions only grow. Slots sit 4 KiB apart so
no one device sector holds both. Blocking I/O: callers use ``trio.to_thread``.

Slot: ``b"CAQP"`` ‖ u64 BE position ‖ u32 BE CRC32 of the 12 bytes before.
"""

from __future__ import annotations

import os
import struct
import zlib

__all__ = ["PositionFile"]

_MAGIC = b"CAQP"
_SLOT = struct.Struct(">4sQI")
_SLOT_OFFSETS = (0, 4096)


class PositionFile:
    """One monotone position on disk; ``fsync`` says whether writes are forced out."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.position, self._next_slot = self._read()

    def _read(self) -> tuple[int, int]:
        best, best_slot = 0, -1
        for slot, offset in enumerate(_SLOT_OFFSETS):
            raw = os.pread(self._fd, _SLOT.size, offset)
            if len(raw) != _SLOT.size:
                continue
            magic, position, crc = _SLOT.unpack(raw)
            if magic == _MAGIC and zlib.crc32(raw[:12]) == crc and position >= best:
                best, best_slot = position, slot
        return best, (best_slot + 1) % len(_SLOT_OFFSETS)

    def write(self, position: int) -> None:
        """Record ``position`` (ignored unless it is higher); durable on return if ``fsync``."""
        if position <= self.position:
            return
        head = _MAGIC + struct.pack(">Q", position)
        os.pwrite(self._fd, head + struct.pack(">I", zlib.crc32(head)),
                  _SLOT_OFFSETS[self._next_slot])
        if self.fsync:
            os.fdatasync(self._fd)
        self.position = position
        self._next_slot = (self._next_slot + 1) % len(_SLOT_OFFSETS)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
