"""A function run in a child forked from the test's process, to be killed with SIGKILL.

The crash tests kill a writer in the middle of its appends, 8 to 20 times each:
a fresh interpreter for each cost a quarter of a second of imports, which a fork
has already. The child is a real process all the same (its own pid, its own file
descriptors, its writes reach the files through the kernel), and a SIGKILL ends
it wherever it is. Use it from synchronous tests only: a child forked inside a
trio run would inherit that run's state.
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

__all__ = ["Forked", "forked"]


@dataclass
class Forked:
    pid: int
    #: What the child writes to its ``out``, line by line (each line flushed at once).
    lines: TextIO

    def kill(self) -> None:
        """SIGKILL the child (if it still runs) and reap it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


@contextmanager
def forked(target: Callable[[TextIO], object]) -> Iterator[Forked]:
    """Run ``target(out)`` in a forked child; killed and reaped on the way out.

    ``out`` is line-buffered: the parent reads each line as soon as it is written.
    An exception in the child goes to the test's stderr and ends the child (the
    parent then reads end of file).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into the test
        status = 1
        try:
            os.close(read_fd)
            with os.fdopen(write_fd, "w", buffering=1) as out:
                target(out)
            status = 0
        except BaseException:
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(status)
    os.close(write_fd)
    child = Forked(pid, os.fdopen(read_fd))
    try:
        yield child
    finally:
        child.kill()
        child.lines.close()
