"""Listeners for incoming channels of one protocol (made by ``Mux.listen``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from p2p.mux._channel import Channel
from p2p.mux._core import ChannelPhase
from p2p.mux._errors import ChannelClosed

if TYPE_CHECKING:
    from p2p.mux._driver import Mux

__all__ = ["ChannelListener"]


class ChannelListener:
    """Incoming channels for one protocol; made by :meth:`Mux.listen`."""

    def __init__(self, mux: Mux, protocol: str) -> None:
        self._mux = mux
        self.protocol = protocol
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False

    async def accept(self) -> Channel:
        """Wait for the next incoming channel of this protocol.

        Raises:
            ChannelClosed: the listener or the mux was closed locally.
            ChannelBroken: the mux ended.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        mux = self._mux
        while True:
            if self._closed:
                raise ChannelClosed("listener was closed", code="LISTENER_CLOSED")
            st = mux._core.accept_nowait(self.protocol)
            if st is not None:
                ch = Channel(mux, st)
                ch._opened.set()
                if st.phase is not ChannelPhase.FREED:
                    mux._live[st] = ch
                await trio.lowlevel.cancel_shielded_checkpoint()
                return ch
            if mux._reason is not None:
                raise mux._broken_error()
            await self._lot.park()

    async def aclose(self) -> None:
        """Stop listening; channels not yet accepted are closed."""
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Stop listening, at once (the same as :meth:`aclose`, without a checkpoint)."""
        if not self._closed:
            self._closed = True
            mux = self._mux
            if mux._listeners.get(self.protocol) is self:
                del mux._listeners[self.protocol]
                if mux._reason is None:
                    mux._core.unlisten(self.protocol)
                    mux._kick()
            self._lot.unpark_all()

    async def __aenter__(self) -> ChannelListener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
