"""The mux and RPC tests' fixture (the helpers are in ``tests/p2p/mux_pairs.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from p2p.mux import Mux

from .mux_pairs import running_mux_pair


@pytest.fixture
async def mux_pair(nursery: trio.Nursery) -> AsyncIterator[tuple[Mux, Mux]]:
    async with running_mux_pair(nursery) as pair:
        yield pair
