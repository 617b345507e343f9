"""Daemon logging: readable lines on a terminal, JSON lines otherwise."""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["configure_logging"]


class JsonFormatter(logging.Formatter):
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


def configure_logging(level: str, *, stream=None) -> None:
    """Log to ``stream`` (stdout by default) at ``level``; JSON unless it is a TTY."""
    stream = stream or sys.stdout
    handler = logging.StreamHandler(stream)
    if stream.isatty():
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s %(message)s")
        )
    else:
        handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
