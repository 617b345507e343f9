"""A swarm's topics: keep our record announced, look peers up and dial them.

* ``join(topic, server=True)`` keeps a signed record of our key, our
  addresses and our relays announced on the topic (re-announced at once when
  our relays change); ``client=True`` looks the topic up at once, then again
  after 0.5 s, 1 s, 2 s … up to ``lookup_max_s``, dialling every peer found.
  Two swarms that join at the same instant therefore meet on the second look.
* ``flush()`` waits until every joined topic has announced once and has run a
  lookup that started after the call, with the dials it queued settled.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from ..dht import DhtError
from ..keys import format_key

if TYPE_CHECKING:
    from ._swarm import Swarm

__all__ = ["Topics"]

log = logging.getLogger(__name__)


@dataclass
class _Topic:
    topic: bytes
    server: bool
    client: bool
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    stopped: trio.Event = field(default_factory=trio.Event)
    announced: trio.Event = field(default_factory=trio.Event)
    refresh: trio.Event = field(default_factory=trio.Event)
    cycles_started: int = 0
    cycles_done: int = 0
    cycle_done: trio.Event = field(default_factory=trio.Event)


class Topics:
    """The topics one swarm has joined, and the tasks that serve them."""

    def __init__(self, swarm: Swarm) -> None:
        self._swarm = swarm
        self._topics: dict[bytes, _Topic] = {}
        #: Set (and replaced) when what we announce changes (our relays).
        self.record_changed = trio.Event()

    def __iter__(self):
        return iter(list(self._topics))

    def client_topics(self) -> set[bytes]:
        return {t for t, s in self._topics.items() if s.client}

    def join(self, topic: bytes, *, server: bool, client: bool) -> None:
        if not (server or client):
            raise ValueError("join needs server=True, client=True or both")
        nursery = self._swarm._running_nursery()
        current = self._topics.get(topic)
        if current is not None:
            if (current.server, current.client) == (server, client):
                return
            current.scope.cancel()
        state = _Topic(topic, server, client)
        self._topics[topic] = state
        nursery.start_soon(self._discover, state)

    async def leave(self, topic: bytes) -> None:
        state = self._topics.pop(topic, None)
        if state is None:
            await trio.lowlevel.checkpoint()
            return
        state.scope.cancel()
        await state.stopped.wait()
        self._swarm.peers.forget_topic(topic)
        for connection in self._swarm.connections.values():
            connection.topics.discard(topic)

    async def flush(self) -> None:
        waits: list[Callable[[], object]] = []
        for state in list(self._topics.values()):
            if state.server:
                waits.append(state.announced.wait)
            if state.client:
                waits.append(functools.partial(self._wait_cycle, state))
        async with trio.open_nursery() as nursery:
            for wait in waits:
                nursery.start_soon(wait)

    def note_record_changed(self) -> None:
        changed, self.record_changed = self.record_changed, trio.Event()
        changed.set()

    async def _wait_cycle(self, state: _Topic) -> None:
        target = state.cycles_started + 1
        state.refresh.set()
        # cycle_done is replaced each time it fires, and fires once more when
        # the topic is left, so this loop always wakes up.
        while state.cycles_done < target and not state.stopped.is_set():
            await state.cycle_done.wait()

    async def _discover(self, state: _Topic) -> None:
        try:
            with state.scope:
                async with trio.open_nursery() as nursery:
                    if state.server:
                        nursery.start_soon(self.announce, state.topic, state)
                    if state.client:
                        nursery.start_soon(self._lookup_loop, state)
        finally:
            state.stopped.set()
            state.cycle_done.set()

    async def announce(
        self, topic: bytes, state: _Topic | None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep our record on ``topic`` (re-announced at once when it changes).

        Reports started after the first announce, stored or not."""
        swarm = self._swarm
        dht = swarm.dht
        assert dht is not None
        started = False
        while True:
            changed = self.record_changed
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(functools.partial(
                        dht.announce, topic, swarm.keypair,
                        addresses=swarm.announced_addresses(),
                        relays=list(swarm.config.relays),
                    ))
                    if state is not None:
                        state.announced.set()
                    if not started:
                        started = True
                        task_status.started()
                    await changed.wait()
                    nursery.cancel_scope.cancel()
            except DhtError as exc:
                log.warning("swarm.announce_failed topic=%s code=%s", format_key(topic)[:12],
                            exc.code)
                if state is not None:
                    state.announced.set()  # flush() must not wait for ever
                if not started:
                    started = True
                    task_status.started()
                await trio.sleep(swarm.config.lookup_min_s * 4)

    async def _lookup_loop(self, state: _Topic) -> None:
        config = self._swarm.config
        delay = config.lookup_min_s
        while True:
            state.refresh = trio.Event()
            state.cycles_started += 1
            try:
                await self._lookup_and_dial(state.topic)
            except DhtError as exc:
                log.info("swarm.lookup_failed topic=%s code=%s", format_key(state.topic)[:12],
                         exc.code)
            state.cycles_done += 1
            done, state.cycle_done = state.cycle_done, trio.Event()
            done.set()
            with trio.move_on_after(delay * (0.75 + 0.5 * self._swarm.rng.random())):
                await state.refresh.wait()
            delay = min(2 * delay, config.lookup_max_s)

    async def _lookup_and_dial(self, topic: bytes) -> None:
        swarm = self._swarm
        assert swarm.dht is not None
        how = f"topic:{format_key(topic)}"
        async with trio.open_nursery() as dials:
            async for record in swarm.dht.lookup(topic):
                key = record.public_key
                if key == swarm.public_key:
                    continue
                swarm.peers.found(record, topic)
                existing = swarm.connections.get(key)
                if existing is not None:
                    existing.add_topics([topic])
                elif swarm.dialer.should_dial(key):
                    dials.start_soon(swarm.dialer.dial_quietly, key, record, how, topic)
