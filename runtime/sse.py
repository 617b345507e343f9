"""Server-sent events, both ways, without I/O: reading a stream's lines into events,
and writing an event. One reading for the CLI's followers and the web UI's, one
writing for every stream the platform serves."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

__all__ = ["SseReader", "encode", "sse_events"]

#: What ends a line in a stream (the SSE standard's three).
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class SseReader:
    """Lines in, events out, one line at a time (for a stream read asynchronously).

    Only ``event:``, ``data:`` (joined with newlines), ``id:`` and comments are
    read; other fields are ignored, as is an event without data.
    """

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []
        #: The last ``id:`` seen (it stays until another, as a browser keeps it for
        #: ``Last-Event-ID``); None before the first.
        self.last_id: str | None = None

    def line(self, line: str) -> tuple[str, str] | None:
        """Feed one line (without its line end): ``(event, data)`` when it ends an
        event, ``("", "")`` for a comment (a keep-alive), else None."""
        if not line:
            event, data = self._event, self._data
            self._event, self._data = "message", []
            return (event, "\n".join(data)) if data else None
        if line.startswith(":"):
            return "", ""
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_id = value
        return None


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """``(event, data)`` per server-sent event; ``("", "")`` per comment (a keep-alive).

    ``lines``: the stream's lines without their line ends (see :class:`SseReader`).
    """
    reader = SseReader()
    for line in lines:
        got = reader.line(line)
        if got is not None:
            yield got


def encode(data: str, *, event: str | None = None, id: str | int | None = None) -> str:
    """One event: each line of ``data`` its own ``data:`` line (a line break inside
    ``data`` cannot end the event early), then the blank line that ends it. A
    reader gets ``data`` back with ``\n`` for each of its line breaks."""
    head = ""
    if event is not None:
        head += f"event: {_one_line(event)}\n"
    if id is not None:
        head += f"id: {_one_line(str(id))}\n"
    body = "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    return f"{head}{body}\n"


def _one_line(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError(f"an SSE field is one line: {value!r}")
    return value
