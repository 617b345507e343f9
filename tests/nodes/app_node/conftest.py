"""Fixtures shared by app-node's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, on a free loopback port."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
