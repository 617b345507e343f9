"""Keeping one named peer connected: a worker to its orchestrator, an agent to its worker.

Topics reconnect what a lookup found; a daemon that must stay in touch with
one known key (hyperswarm's ``joinPeer``) runs :func:`stay_connected` in a
task it owns. The loop dials, waits for the connection to end, and dials
again after a back-off that grows on failures (with jitter, so a worker that
restarts does not meet all of its agents at the same instant) and starts
short again once a connection held.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

from ..connection import Address, Connection
from ..keys import format_key
from ._errors import SwarmError

__all__ = ["UpkeepPolicy", "stay_connected"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpkeepPolicy:
    """Waits between attempts: ``base_s`` doubling up to ``max_s``, times a jitter in [0.5, 1.5)."""

    base_s: float = 0.25
    max_s: float = 15.0
    #: A connection that lasted this long resets the wait to ``base_s``.
    proven_after_s: float = 10.0
    #: Longest wait for one dial (DHT lookup, addresses, relays).
    dial_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            raise ValueError("UpkeepPolicy needs 0 < base_s <= max_s")


async def stay_connected(
    swarm, public_key: bytes, *,
    addresses: Iterable[Address] | None = None,
    on_connection: Callable[[Connection], Awaitable[None]] | None = None,
    backoff: UpkeepPolicy = UpkeepPolicy(),
    rng: random.Random | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep a connection to ``public_key`` until cancelled.

    Args:
        swarm: the running :class:`~p2p.swarm.Swarm`.
        addresses: tried instead of a DHT lookup when given (``host:port``
            pairs); the DHT is asked when they all fail.
        on_connection: run for each new connection; cancelled when it ends.
        backoff: the waits between failed attempts.

    Never raises for a dial that fails: it logs the reason once per change
    and tries again. ``task_status.started()`` is called at once.
    """
    rng = rng or random.Random()
    listed = tuple(addresses) if addresses else None
    label = format_key(public_key)[:12]
    task_status.started()
    failures = 0
    last_reason = None
    while True:
        connection = None
        failure: SwarmError | None = None
        with trio.move_on_after(backoff.dial_timeout_s):
            try:
                connection = await swarm.connect(public_key, addresses=listed)
            except SwarmError as exc:
                failure = exc
            if connection is None and listed is not None:
                try:  # the listed addresses failed: ask the DHT where it is now
                    connection = await swarm.connect(public_key)
                except SwarmError as exc:
                    failure = exc
        if connection is None and str(failure) != last_reason:
            last_reason = str(failure)
            log.info("upkeep.dial_failed peer=%s code=%s reason=%s", label,
                     getattr(failure, "code", "TIMEOUT"), failure or "dial timed out")
        if connection is None:
            failures += 1
            wait = min(backoff.max_s, backoff.base_s * 2 ** min(failures - 1, 30))
            await trio.sleep(wait * (0.5 + rng.random()))
            continue
        if last_reason is not None or failures:
            log.info("upkeep.connected peer=%s after_failures=%d", label, failures)
        last_reason = None
        began = trio.current_time()
        async with trio.open_nursery() as nursery:
            if on_connection is not None:
                nursery.start_soon(_run_until_closed, on_connection, connection)
            await connection.wait_closed()
            nursery.cancel_scope.cancel()
        held = trio.current_time() - began
        failures = 0 if held >= backoff.proven_after_s else failures + 1
        wait = backoff.base_s * 2 ** min(failures, 30) if failures else backoff.base_s
        await trio.sleep(min(backoff.max_s, wait) * (0.5 + rng.random()))


async def _run_until_closed(hook: Callable[[Connection], Awaitable[None]],
                            connection: Connection) -> None:
    try:
        await hook(connection)
    except Exception:  # the hook's failure must not end the upkeep
        log.exception("upkeep.hook_failed peer=%s", connection.peer_label)
