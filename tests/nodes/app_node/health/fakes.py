"""Fakes for the health tests: a store in memory, a service that goes down and up,
and a wall clock that moves with trio's."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from contracts.health import ServiceStatus, service_status
from nodes.app_node.health import MAX_ROWS, HealthRow, HealthStoreError, Target


class MemoryHealthStore:
    """The HealthStore interface on a list (no threads: autojump_clock tests)."""

    def __init__(self) -> None:
        self.rows: list[HealthRow] = []
        self.failing = False
        self.pruned: list[float] = []

    def _check(self) -> None:
        if self.failing:
            raise HealthStoreError("memory store told to fail")

    async def add(self, rows: Sequence[HealthRow]) -> None:
        self._check()
        self.rows += rows

    async def latest(self) -> dict[str, HealthRow]:
        self._check()
        newest: dict[str, HealthRow] = {}
        for row in self.rows:
            if row.service not in newest or row.at >= newest[row.service].at:
                newest[row.service] = row
        return newest

    async def history(self, since: float, until: float, *, service: str | None = None,
                      limit: int = MAX_ROWS) -> list[HealthRow]:
        self._check()
        rows = sorted((r for r in self.rows if since <= r.at <= until
                       and (service is None or r.service == service)), key=lambda r: r.at)
        return rows[len(rows) - limit:] if limit else []

    async def prune(self, before: float) -> int:
        self._check()
        self.pruned.append(before)
        kept = [r for r in self.rows if r.at >= before]
        gone, self.rows = len(self.rows) - len(kept), kept
        return gone

    async def aclose(self) -> None:
        pass


class FakeService:
    """A service whose answer a test sets: ``up``, ``hang`` (never answers),
    ``refuse`` (an RPC refusal), ``gone`` (the connection broke), ``crash``."""

    def __init__(self, name: str = "wrk-ork", latency_s: float = 0.02) -> None:
        self.name = name
        self.mode = "up"
        self.latency_s = latency_s
        self.queue_depth = 0
        self.asked = 0

    async def ask(self, timeout_s: float) -> ServiceStatus:
        from p2p.rpc import RpcError

        self.asked += 1
        await trio.sleep(self.latency_s)
        if self.mode == "hang":
            await trio.sleep_forever()
        if self.mode == "refuse":
            raise RpcError("FORBIDDEN", "only app-node may call wrk-ork")
        if self.mode == "gone":
            raise RpcError("CHANNEL_CLOSED", "the RPC channel ended")
        if self.mode == "crash":
            raise ValueError("a bug in the probe")
        return service_status(self.name, started_at=1.0, queue_depth=self.queue_depth,
                              last_report_at=123.0)

    @property
    def target(self) -> Target:
        return Target(self.name, self.ask)


class WallClock:
    """The wall clock rows are stamped with, moving with trio's (autojump) clock."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.start = start

    def __call__(self) -> float:
        return self.start + trio.current_time()
