"""The health rows in Redis, when app-node's settings name one (``redis_url``, as the
rate limiter's): app-nodes behind a balancer then show the same history.

Layout (``key_prefix`` default ``cac:health:``)::

    <prefix>services           SET   every service with rows
    <prefix>rows:<service>     ZSET  member: the row as JSON, score: its ``at``

A sorted set a service, scored by time: a window is ``ZRANGEBYSCORE``, the
newest row ``ZRANGE -1 -1``, pruning ``ZREMRANGEBYSCORE``. Each add also caps
the set at ``max_rows_per_service`` (``ZREMRANGEBYRANK``), so even a prober
that never prunes cannot grow Redis without bound. A row is unique by its
JSON (its ``at`` is in it), so two app-nodes probing at once keep both rows.

Shortcoming: several app-nodes sharing one Redis each add their own probes,
so a service's uptime counts every app-node's view of it (each one's rows
are right, there are just more of them).

As the rate limiter does, the synchronous ``redis`` client runs in worker
threads (capped) with short socket timeouts, so a dead Redis costs a probe
round a timeout, never a hung thread. Its errors are
:class:`~._store.HealthStoreError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from ..redis_client import connect, redis_error
from ._model import DEFAULT_INTERVAL_S, MAX_ROWS, RETENTION_S, HealthRow
from ._store import HealthStoreError

__all__ = ["RedisHealthStore"]

#: A day of probes at the default interval, with room for a shorter one.
DEFAULT_MAX_ROWS_PER_SERVICE = int(2 * RETENTION_S / DEFAULT_INTERVAL_S)


class RedisHealthStore:
    """The rows in Redis at ``url`` (see the module doc)."""

    def __init__(self, url: str, *, key_prefix: str = "cac:health:", timeout_s: float = 1.0,
                 max_rows_per_service: int = DEFAULT_MAX_ROWS_PER_SERVICE,
                 max_threads: int = 4) -> None:
        self._client = connect(url, timeout_s=timeout_s, decode_responses=True)
        self._redis_error = redis_error()
        self._prefix = key_prefix
        self._max_rows = max_rows_per_service
        self._threads = trio.CapacityLimiter(max_threads)
        self.url = url

    def _rows_key(self, service: str) -> str:
        return f"{self._prefix}rows:{service}"

    async def _run(self, what: str, fn, *args) -> Any:
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._threads)
        except self._redis_error as exc:
            raise HealthStoreError(f"health history in Redis: {what} failed: "
                                   f"{type(exc).__name__}: {exc}") from exc

    def _services(self) -> list[str]:
        return sorted(self._client.smembers(self._prefix + "services"))

    async def add(self, rows: Sequence[HealthRow]) -> None:
        def write() -> None:
            pipe = self._client.pipeline(transaction=False)
            for row in rows:
                key = self._rows_key(row.service)
                pipe.sadd(self._prefix + "services", row.service)
                pipe.zadd(key, {row.model_dump_json(): row.at})
                pipe.zremrangebyrank(key, 0, -(self._max_rows + 1))
            pipe.execute()

        if rows:
            await self._run("adding rows", write)

    async def latest(self) -> dict[str, HealthRow]:
        def read() -> list[list[str]]:
            services = self._services()
            pipe = self._client.pipeline(transaction=False)
            for service in services:
                pipe.zrange(self._rows_key(service), -1, -1)
            return pipe.execute()

        found = await self._run("reading", read)
        rows = [HealthRow.model_validate_json(raw[0]) for raw in found if raw]
        return {row.service: row for row in rows}

    async def history(self, since: float, until: float, *, service: str | None = None,
                      limit: int = MAX_ROWS) -> list[HealthRow]:
        limit = max(limit, 0)

        def read() -> list[list[str]]:
            services = [service] if service is not None else self._services()
            pipe = self._client.pipeline(transaction=False)
            for name in services:  # each one's newest ``limit``: enough for the merge
                pipe.zrevrangebyscore(self._rows_key(name), until, since, start=0,
                                      num=limit)
            return pipe.execute()

        found = await self._run("reading", read)
        rows = [HealthRow.model_validate_json(raw) for part in found for raw in part]
        rows.sort(key=lambda row: row.at)
        return rows[len(rows) - limit:] if limit else []

    async def prune(self, before: float) -> int:
        def delete() -> int:
            services = self._services()
            pipe = self._client.pipeline(transaction=False)
            for name in services:
                pipe.zremrangebyscore(self._rows_key(name), "-inf", f"({before}")
                pipe.zcard(self._rows_key(name))
            results = pipe.execute()
            gone = [name for name, count in zip(services, results[1::2], strict=True) if count == 0]
            if gone:
                self._client.srem(self._prefix + "services", *gone)
            return sum(results[0::2])

        return await self._run("pruning", delete)

    async def aclose(self) -> None:
        self._client.close()
