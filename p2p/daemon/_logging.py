"""Daemon logging: readable lines on a terminal, JSON lines otherwise.

One JSON object per line (``ts``, ``level``, ``logger``, ``message``, and
``exception`` when there is one) is what log shippers read; a person at a
terminal gets ``time level logger message``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

__all__ = ["QUIET_BELOW_DEBUG", "JsonFormatter", "configure_logging"]

#: Libraries whose INFO lines are one per request: shown only at ``debug``.
QUIET_BELOW_DEBUG = ("httpx",)

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


def configure_logging(level: str = "info", *, stream: TextIO | None = None,
                      format: str = "auto") -> None:
    """Send the root logger's records to ``stream`` at ``level``.

    Args:
        level: ``debug``, ``info``, ``warning``, ``error`` or ``critical``.
        stream: where to write (stderr by default: stdout is a daemon's data).
        format: ``text``, ``json``, or ``auto`` (text on a TTY, JSON otherwise).

    Replaces any handler set before (``logging.basicConfig`` or an earlier call).
    """
    stream = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(stream)
    as_text = format == "text" or (format == "auto" and _is_tty(stream))
    handler.setFormatter(logging.Formatter(TEXT_FORMAT) if as_text else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # httpx logs every request at INFO: an agent's health check every 2 s, a
    # Loki push every flush. Their failures still show (WARNING); ``debug``
    # shows everything.
    chatty = logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    for name in QUIET_BELOW_DEBUG:
        logging.getLogger(name).setLevel(chatty)
