"""One live stream per browser: the topics of all its open pages, multiplexed.

A browser opens at most six HTTP/1.1 connections to one origin, and a stream
holds one for as long as its page is open: with one stream per page, a seventh
tab would wait for a free connection and not load. So the pages of a browser
share one stream (``static/stream-worker.js``, a SharedWorker): ``GET
/ui/stream?topic=jobs&topic=job:ID&topic=logs:ID``. Each topic is one of
app-node's event streams (opened as the signed-in user), translated into
fragments of the pages that show it.

On the wire each fragment is an unnamed event whose first data line is its
topic, the rest the HTML (every fragment rendered from a template); a log
fragment carries its last record's cursor as the event's ``id``, and the worker
asks to resume from it (``topic=logs:ID CURSOR``) when it opens the stream
again. ``event: done`` names a topic that has ended for good (its job was
deleted): it is not asked for again.

Each topic starts with a snapshot of what its page shows, so a stream opened
again (a new tab, a dropped connection, app-node restarted) brings every page up
to date. When any topic's upstream ends or breaks, the whole stream ends and
the worker opens it again (a snapshot per topic is cheap, and one way to
recover is easier to get right than several). The stream also ends when the
session does (signed out elsewhere, expired), and when the UI stops.

This module knows no page: a topic's kind (``jobs``, ``job``...) is resolved by
the pages that registered it (:meth:`Live.register`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from runtime.sse import encode

from .api import ApiClient, ApiError

__all__ = ["DONE", "KEEPALIVE", "Cursored", "Live", "Piece", "TopicSource"]

log = logging.getLogger(__name__)

#: Topics one stream may carry (a browser's open pages; each is an upstream stream).
MAX_TOPICS = 16
#: Characters of one topic (its kind, argument and resume cursor).
MAX_TOPIC_CHARS = 512
#: How often an open stream checks that its session still stands.
SESSION_CHECK_S = 5.0


class _Marker:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: A translator yields this for each upstream keep-alive (the browser's too).
KEEPALIVE = _Marker("KEEPALIVE")
#: A translator yields this when its topic has ended for good (a deleted job).
DONE = _Marker("DONE")


@dataclass(frozen=True)
class Cursored:
    """A fragment that moves its topic's resume point (log records up to ``cursor``)."""

    html: str
    cursor: str


#: What a topic's translator yields: a fragment's HTML, or one of the above.
Piece = str | Cursored | _Marker

Translate = Callable[[ApiClient, AsyncIterator[tuple[str, str]]], AsyncIterator[Piece]]


@dataclass(frozen=True)
class TopicSource:
    """Where a topic's pieces come from: app-node's event stream at ``path`` (with
    ``params``), translated; ``opening_failed`` may answer an upstream that does not
    open with pieces instead of failing the stream (a deleted job's page)."""

    path: str
    translate: Translate
    params: dict[str, str] | None = None
    opening_failed: Callable[[ApiError], list[Piece] | None] | None = None


#: A kind's resolver: the stream's request, the topic's argument and resume cursor
#: (None: from the start) to its source; ValueError for an argument it cannot take.
Resolver = Callable[[Request, str, str | None], TopicSource]


class TopicError(ValueError):
    """A topic no page serves, or one too long; the message says which."""


@dataclass(frozen=True)
class Topic:
    """One asked topic: ``key`` (``kind:argument``) names it on the wire."""

    key: str
    source: TopicSource


class Live:
    """The registered topic kinds, and how many upstream streams are open."""

    def __init__(self, max_streams: int) -> None:
        #: Upstream streams at most (each topic of each open stream is one).
        self.max_streams = max_streams
        self.streams_open = 0
        self._kinds: dict[str, Resolver] = {}
        #: The open streams of each session, to end them when it is signed out.
        self._of_session: dict[str, set[trio.CancelScope]] = {}

    def register(self, kind: str, resolve: Resolver) -> None:
        self._kinds[kind] = resolve

    def topics(self, request: Request, asked: list[str]) -> list[Topic]:
        """The asked topics (``kind[:argument][ cursor]`` each), or :class:`TopicError`."""
        if not asked:
            raise TopicError("no topic asked: topic=jobs, topic=job:ID or topic=logs:ID")
        if len(asked) > MAX_TOPICS:
            raise TopicError(f"{len(asked)} topics asked; one stream carries {MAX_TOPICS}")
        topics: dict[str, Topic] = {}
        for raw in asked:
            if len(raw) > MAX_TOPIC_CHARS:
                raise TopicError(f"a topic of {len(raw)} characters; at most "
                                 f"{MAX_TOPIC_CHARS}")
            key, _, cursor = raw.partition(" ")
            kind, _, argument = key.partition(":")
            resolve = self._kinds.get(kind)
            if resolve is None:
                raise TopicError(f"no such topic kind {kind!r}")
            try:
                source = resolve(request, argument, cursor or None)
            except ValueError as exc:
                raise TopicError(f"topic {key!r}: {exc}") from None
            topics[key] = Topic(key, source)
        return list(topics.values())

    def end_session(self, session_id: str) -> None:
        """End the open streams of ``session_id`` (signed out)."""
        for scope in self._of_session.pop(session_id, ()):
            scope.cancel()

    async def respond(self, api: ApiClient, topics: list[Topic], session_id: str,
                      still_signed_in: Callable[[], bool]) -> Response:
        """Open every topic's upstream, then stream; an error status when one does not
        open (so the browser backs off and says it is reconnecting)."""
        if self.streams_open + len(topics) > self.max_streams:
            return PlainTextResponse(f"this UI serves {self.max_streams} live streams at "
                                     "most; the page retries", status_code=503,
                                     headers={"retry-after": "5"})
        opened: list[_Opened] = []
        try:
            for topic in topics:
                # Each upstream closes when its topic ends (a deleted job's), not only
                # with the whole stream.
                stack = AsyncExitStack()
                self.streams_open += 1
                stack.callback(self._closed, 1)
                source = topic.source
                try:
                    events = await stack.enter_async_context(
                        api.events(source.path, **(source.params or {})))
                except ApiError as error:
                    await stack.aclose()
                    pieces = (source.opening_failed(error) if source.opening_failed
                              else None)
                    if pieces is None:
                        raise
                    opened.append(_Opened(topic, pieces, AsyncExitStack()))
                    continue
                opened.append(_Opened(topic, events, stack))
        except ApiError as error:
            await _close_all(opened)
            status = error.status if 400 <= error.status < 600 else 502
            return PlainTextResponse(error.message, status_code=status)
        except BaseException:
            await _close_all(opened)
            raise
        return _Multiplexed(self, session_id, api, opened, still_signed_in)

    def _track(self, session_id: str, scope: trio.CancelScope) -> None:
        self._of_session.setdefault(session_id, set()).add(scope)

    def _untrack(self, session_id: str, scope: trio.CancelScope) -> None:
        scopes = self._of_session.get(session_id)
        if scopes is not None:
            scopes.discard(scope)
            if not scopes:
                del self._of_session[session_id]

    def _closed(self, count: int) -> None:
        self.streams_open -= count


_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class _Multiplexed(Response):
    """The open topics' pieces as one event stream, until a topic's upstream ends, the
    browser leaves, the session ends or the UI stops; the upstreams are closed
    however it ends."""

    def __init__(self, live: Live, session_id: str, api: ApiClient, opened: list[_Opened],
                 still_signed_in: Callable[[], bool]) -> None:
        super().__init__()
        self._live, self._session_id = live, session_id
        self._api, self._opened = api, opened
        self._still_signed_in = still_signed_in
        self._send_lock = trio.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ended_by_sign_out = trio.CancelScope()
        self._live._track(self._session_id, ended_by_sign_out)
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": _HEADERS})
            with ended_by_sign_out:
                await self._stream(receive, send)
            with trio.move_on_after(1):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the browser left mid-write
        finally:
            self._live._untrack(self._session_id, ended_by_sign_out)
            await _close_all(self._opened)

    async def _stream(self, receive: Any, send: Any) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._until_disconnect, receive, nursery.cancel_scope)
            nursery.start_soon(self._while_signed_in, nursery.cancel_scope)
            done = _Countdown(len(self._opened), nursery.cancel_scope)
            for opened in self._opened:
                nursery.start_soon(self._run, opened, send, done, nursery.cancel_scope)

    async def _write(self, send: Any, text: str) -> None:
        async with self._send_lock:
            await send({"type": "http.response.body", "body": text.encode(),
                        "more_body": True})

    async def _run(self, opened: _Opened, send: Any, done: _Countdown,
                   everything: trio.CancelScope) -> None:
        topic, events = opened.topic, opened.events
        pieces = (_each(events) if isinstance(events, list)
                  else topic.source.translate(self._api, events))
        try:
            async for piece in pieces:
                if piece is DONE:
                    with trio.CancelScope(shield=True):
                        await opened.stack.aclose()
                    await self._write(send, encode(topic.key, event="done"))
                    done.one()
                    return
                if piece is KEEPALIVE:
                    await self._write(send, ": keep-alive\n\n")
                elif isinstance(piece, Cursored):
                    await self._write(send, encode(f"{topic.key}\n{piece.html}",
                                                   id=piece.cursor))
                elif isinstance(piece, str):
                    await self._write(send, encode(f"{topic.key}\n{piece}"))
        except ApiError as error:  # the upstream broke: the browser opens the stream again
            log.info("ui.stream_ended topic=%s code=%s message=%s", topic.key, error.code,
                     error.message)
        everything.cancel()  # an upstream ended: all of it is opened again

    async def _until_disconnect(self, receive: Any, everything: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        everything.cancel()

    async def _while_signed_in(self, everything: trio.CancelScope) -> None:
        """Ends the stream once its session has (expired; signing out ends it at once)."""
        while True:
            await trio.sleep(SESSION_CHECK_S)
            if not self._still_signed_in():
                everything.cancel()
                return


@dataclass
class _Opened:
    """A topic whose upstream opened (its events), or whose opening failure was
    answered with pieces; ``stack`` closes its upstream."""

    topic: Topic
    events: AsyncIterator[tuple[str, str]] | list[Piece]
    stack: AsyncExitStack


async def _close_all(opened: list[_Opened]) -> None:
    with trio.CancelScope(shield=True):
        for each in opened:
            await each.stack.aclose()


class _Countdown:
    """Cancels ``scope`` once ``count`` topics have ended for good."""

    def __init__(self, count: int, scope: trio.CancelScope) -> None:
        self._left, self._scope = count, scope

    def one(self) -> None:
        self._left -= 1
        if self._left <= 0:
            self._scope.cancel()


async def _each(pieces: list[Piece]) -> AsyncIterator[Piece]:
    for piece in pieces:
        yield piece

