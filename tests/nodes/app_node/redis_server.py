"""A throwaway redis-server for the tests that need one (rate limits, health).

Those tests are skipped only when redis-server is not installed and ``CI`` is
unset; in CI (.ci/run installs Debian's redis-server) a missing server fails
the suite. The ``redis_server`` fixture lives in ``tests/nodes/app_node/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from nodes.app_node.redis_client import connect, redis_error

if TYPE_CHECKING:
    import redis

REDIS_SERVER = shutil.which("redis-server")

if REDIS_SERVER is None and os.environ.get("CI"):
    raise RuntimeError("redis-server is not installed but CI is set: install it "
                       "(bash .ci/run deps) so the Redis tests run")

#: Mark a test or module that needs redis-server.
needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason=(
    "redis-server not installed (apt-get install redis-server); required when CI is set"))


class RedisServer:
    """One throwaway redis-server: loopback only, no persistence, its own temp dir."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.directory),
             "--daemonize", "no", "--loglevel", "warning"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        client = connect(self.url, timeout_s=0.2)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis_error():
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    self.stop()
                    raise RuntimeError(f"redis-server on port {self.port} did not start: {err}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def client(self) -> redis.Redis:
        return connect(self.url, timeout_s=1)
