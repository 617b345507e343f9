"""Daemon logging for commands: the kit's, on stdout unless told otherwise.

The kit (:mod:`p2p.daemon`) logs to stderr by default; ``up`` and the ``dht``
commands keep logging on stdout as they always have.
"""

from __future__ import annotations

import sys
from typing import TextIO

from p2p.daemon import JsonFormatter
from p2p.daemon import configure_logging as _configure

__all__ = ["JsonFormatter", "configure_logging"]


def configure_logging(level: str, *, stream: TextIO | None = None,
                      format: str = "auto") -> None:
    """Log to ``stream`` (stdout by default) at ``level``; JSON unless it is a TTY."""
    _configure(level, stream=stream if stream is not None else sys.stdout, format=format)
