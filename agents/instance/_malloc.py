"""Keep large buffers on the heap: what makes a Python shell stream cheap.

Every frame of a bulk stream (256 KiB of output, its ciphertext, the socket
reads of the layers below) is a fresh ``bytes`` above glibc's initial mmap
threshold (128 KiB), so by default each one is a fresh ``mmap`` that the kernel
zero-fills page by page and ``munmap``s on free: ``perf`` showed page faults,
``clear_page`` and memcg charging at a quarter of ``cosmicac shell``'s CPU, and
its system time fell from 3.5 s to 0.5 s per GiB with the two settings below
(the agent's side: 5.7 to 3.3 ns of CPU per byte, ``bench/shell.py``).

A process-wide setting, so only entry points call it (``cosmicac shell``, the
agent's boot), never a library on import. Outside glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import logging

__all__ = ["keep_large_buffers"]

log = logging.getLogger(__name__)

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations below this come from the heap (glibc caps it at 32 MiB on 64-bit).
MMAP_THRESHOLD_BYTES = 4 << 20
#: Free heap kept at the top before it is returned to the kernel.
TRIM_THRESHOLD_BYTES = 64 << 20


def keep_large_buffers(mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES,
                       trim_threshold_bytes: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Serve allocations up to ``mmap_threshold_bytes`` from the heap and keep up
    to ``trim_threshold_bytes`` of free heap (glibc ``mallopt``).

    Returns:
        True if glibc took both settings; False elsewhere (musl, macOS), where
        nothing changed.
    """
    try:
        # The symbols already in this process (libc's among them): find_library
        # would run ldconfig, ten milliseconds of every container agent's start.
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = (mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes) == 1
            and mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes) == 1)
    log.debug("malloc.tuned mmap_threshold=%d trim_threshold=%d ok=%s",
              mmap_threshold_bytes, trim_threshold_bytes, done)
    return done
