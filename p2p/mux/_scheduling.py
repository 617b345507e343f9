"""Busy polling: stay awake for a reply instead of sleeping in epoll (off by default).

Why: on a loopback or LAN round trip most of the latency is not work but
wake-ups. A process that blocks in ``epoll_wait`` right after sending a request
is descheduled, and the reply must then wake it (on a virtual machine an idle
vCPU may even have to be woken by an interrupt). Measured on this project's
2-core VM, a trio TCP ping-pong between two processes takes ~95 µs when both
sleep between messages and ~33 µs when both keep polling; a full RPC round
trip ~390 µs against ~185 µs.

What: for a short window after each write, a spinner task keeps one task
runnable, so trio polls for I/O with a zero timeout instead of blocking, and
the reply is handled the moment it lands. When nothing is written for the
window, the spinner parks and the process sleeps as before. This is the idea of
Linux's ``SO_BUSY_POLL``/``net.core.busy_poll`` and of adaptive mutexes: burn a
bounded amount of CPU right after activity, never while idle. The cost is up
to one window of one core per write that gets no quick answer.

One spinner serves the whole trio run (every mux in the process shares it), so
a node with many connections still adds one runnable task, not one per
connection. It is a trio *system task*: a runtime service owned by the run
itself, like trio's own, parked whenever no window is open.

It is a benchmark setting, off by default (``MuxConfig.busy_poll_s = 0``): a
daemon streaming tokens all day would keep a core busy with it. Only public trio
API is used (``spawn_system_task``, ``RunVar``, ``ParkingLot``, checkpoints), and
no send path looks at it: a write only notes when it happened.
"""

from __future__ import annotations

import time

import trio

__all__ = ["BusyPoller", "shared_poller"]

_SHARED = trio.lowlevel.RunVar("p2p_mux_busy_poller")


def shared_poller() -> BusyPoller:
    """Return this trio run's poller, starting its spinner on first use."""
    try:
        return _SHARED.get()
    except LookupError:
        poller = BusyPoller()
        trio.lowlevel.spawn_system_task(poller.run, name="p2p.mux.busy-poll")
        _SHARED.set(poller)
        return poller


class BusyPoller:
    """Keeps trio polling without blocking until the latest window closes."""

    def __init__(self) -> None:
        self._until = 0.0
        self._lot = trio.lowlevel.ParkingLot()
        #: True while the spinner is awake (polling), False while it is parked.
        self.spinning = False
        self.spins = 0

    def note_sent(self, window_s: float) -> None:
        """A frame was written: poll for the answer for the next ``window_s``."""
        # Real time, not trio's clock: the window is about CPU and wake-ups, and
        # under a virtual clock (tests) trio time stands still while we spin.
        until = time.perf_counter() + window_s
        if until > self._until:
            self._until = until
        if not self.spinning and self._lot:
            self._lot.unpark()

    def note_received(self) -> None:
        """Bytes arrived: what we were polling for is here; stop early.

        With several connections this may end another's window early; that
        costs only the latency the window would have saved, never correctness.
        """
        self._until = 0.0

    async def run(self) -> None:
        while True:
            if time.perf_counter() >= self._until:
                self.spinning = False
                await self._lot.park()
                self.spinning = True
                continue
            self.spins += 1
            # One scheduler pass: trio polls I/O without blocking while any
            # task is runnable.
            await trio.lowlevel.cancel_shielded_checkpoint()
