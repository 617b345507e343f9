"""Which in-process daemon (or agent) a log record belongs to.

Each daemon ships the records of its own process to wrk-monitor through a
handler on the root logger. In the in-process cluster every daemon and
agent shares one root logger, so each handler would ship everyone's records
under its own service. The harness runs each daemon in a task whose context
names it (:func:`set_owner`; trio's child tasks and ``to_thread`` calls
inherit the context), and each shipping handler keeps only the records
logged under the owner that was current when it was made.

A process that dies leaves its queues' directories unlocked (the kernel
drops its flocks); a daemon whose tasks are cancelled does not close its
queues. :func:`owned_shipping` records each queue opened under an owner, and
:func:`release` closes them once that daemon stopped, so that it can start
again on the same storage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import trio

from nodes.kit import telemetry
from p2p.queue import DurableQueue
from runtime.log_shipper import ShipperHandler

__all__ = ["owned_by", "owned_shipping", "release", "set_owner"]

_OWNER: ContextVar[str | None] = ContextVar("in_process_owner", default=None)
#: The queues each owner opened and has not released.
_QUEUES: dict[str | None, list[DurableQueue]] = {}


def set_owner(owner: str) -> None:
    """The calling task (and every task and thread it starts from now on) is ``owner``'s."""
    _OWNER.set(owner)


def owned_by(owner: str | None) -> Callable[[logging.LogRecord], bool]:
    """A handler filter: only the records logged by ``owner``'s tasks."""
    return lambda record: _OWNER.get() == owner


class _OwnedShipperHandler(ShipperHandler):
    """The daemons' shipping handler, keeping the records of the daemon that made it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.addFilter(owned_by(_OWNER.get()))


async def release(owner: str) -> None:
    """Close the queues ``owner`` opened, as its process's death would free them."""
    with trio.CancelScope(shield=True), trio.move_on_after(10):
        for queue in _QUEUES.pop(owner, []):
            await queue.aclose()


@contextmanager
def owned_shipping() -> Iterator[None]:
    """While in it, the daemons' telemetry ships only their own records and their
    queues are recorded (see the module doc); the root logger lets INFO through, as
    the daemon kit sets it."""
    root = logging.getLogger()
    level = root.level
    original_handler = telemetry.ShipperHandler
    original_open = DurableQueue.__dict__["open"]

    async def open_recorded(cls, *args, **kwargs) -> DurableQueue:
        queue = await original_open.__func__(cls, *args, **kwargs)
        _QUEUES.setdefault(_OWNER.get(), []).append(queue)
        return queue

    telemetry.ShipperHandler = _OwnedShipperHandler  # type: ignore[misc]
    DurableQueue.open = classmethod(open_recorded)  # type: ignore[method-assign]
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        yield
    finally:
        telemetry.ShipperHandler = original_handler  # type: ignore[misc]
        DurableQueue.open = original_open  # type: ignore[method-assign]
        root.setLevel(level)
        _QUEUES.clear()
