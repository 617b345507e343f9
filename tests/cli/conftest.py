"""Fixtures of the CLI tests: app-node served in this process, alone (``served``),
with wrk-ork (``served_ork``), and with wrk-monitor too (``served_logs``); see
:mod:`tests.cli.support`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from .support import Served, ServedOrk, serve, serve_ork


@pytest.fixture
async def served(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Served]:
    yield await serve(tmp_path, nursery)
    nursery.cancel_scope.cancel()


@pytest.fixture
async def served_ork(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[ServedOrk]:
    yield await serve_ork(tmp_path, nursery, monitor=False)
    nursery.cancel_scope.cancel()


@pytest.fixture
async def served_logs(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[ServedOrk]:
    yield await serve_ork(tmp_path, nursery, monitor=True)
    nursery.cancel_scope.cancel()
