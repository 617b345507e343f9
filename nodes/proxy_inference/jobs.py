"""Where the routing table comes from: wrk-ork's jobs, followed over the swarm.

A :class:`JobSource` runs until cancelled and calls ``publish(jobs)`` with
the whole current list of jobs each time it may have changed; the proxy
rebuilds its :class:`~.router.RoutingTable` from it. Two sources:

- :class:`OrkJobSource`: the real one. It keeps a connection to wrk-ork
  (``p2p.swarm.stay_connected``), opens ``cosmicac-ork/1`` on it, starts
  ``jobs.watch`` (status changes) and reads ``jobs.list`` once at the start,
  after every burst of changes, and every ``refresh_s`` (an agent key can
  change without a job status changing, e.g. a replica restarted within an
  Active job). wrk-ork gives the proxy's key the proxy role by its ``proxies``
  setting (reading and following jobs, nothing else); a
  ``FORBIDDEN`` answer is logged once per connection and tried again later.
- :class:`StaticJobSource`: jobs a test or a benchmark sets by hand.

When the connection to wrk-ork is lost the last table stays in force: the
agents keep serving, and the proxy keeps routing to them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import trio

from contracts.ork import LIST_JOBS, PROTOCOL, WATCH_JOBS, JobView, ListJobs, WatchJobs
from p2p.connection import Address, Connection
from p2p.keys import format_key
from p2p.rpc import RpcClient, RpcError
from p2p.swarm import Swarm, stay_connected

__all__ = ["JobSource", "OrkJobSource", "Publish", "StaticJobSource"]

log = logging.getLogger(__name__)

#: ``publish(jobs)``: the whole current job list.
Publish = Callable[[Sequence[JobView]], None]
#: Changes that arrive within this long are read with one ``jobs.list``.
DEBOUNCE_S = 0.05
#: Longest wait for one ``jobs.list``.
CALL_TIMEOUT_S = 20.0


class JobSource(Protocol):
    """Something that tells the proxy which jobs exist."""

    async def run(self, publish: Publish, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish the jobs at once if known, then on every change, until cancelled."""
        ...


class StaticJobSource:
    """Jobs given by hand (:meth:`set`), for tests and benchmarks."""

    def __init__(self, jobs: Iterable[JobView] = ()) -> None:
        self.jobs = list(jobs)
        self._publish: Publish | None = None

    def set(self, jobs: Iterable[JobView]) -> None:
        self.jobs = list(jobs)
        if self._publish is not None:
            self._publish(self.jobs)

    async def run(self, publish: Publish, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._publish = publish
        publish(self.jobs)
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self._publish = None


class OrkJobSource:
    """wrk-ork's jobs, over the swarm (see the module doc).

    Args:
        swarm: the proxy's running swarm.
        ork: wrk-ork's public key.
        addresses: where wrk-ork listens, tried before the DHT.
        refresh_s: read the list again this often without a change.
    """

    def __init__(self, swarm: Swarm, ork: bytes, *, addresses: Sequence[Address] = (),
                 refresh_s: float = 10.0) -> None:
        self.swarm = swarm
        self.ork = ork
        self.addresses = tuple(addresses)
        self.refresh_s = refresh_s
        self.reads = 0
        self.connected = False
        self._changed = trio.Event()

    async def run(self, publish: Publish, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await stay_connected(self.swarm, self.ork, addresses=self.addresses or None,
                             on_connection=functools.partial(self._follow, publish),
                             task_status=task_status)

    async def _follow(self, publish: Publish, connection: Connection) -> None:
        label = format_key(self.ork)[:12]
        channel = await connection.open_channel(PROTOCOL)
        client = RpcClient(channel, name="proxy-ork")
        self._changed = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            self.connected = True
            try:
                nursery.start_soon(self._watch, client, label)
                while True:
                    try:
                        jobs = await _every_job(client)
                    except RpcError as exc:
                        if exc.code == "CHANNEL_CLOSED":
                            return
                        log.warning("proxy.jobs_list_failed ork=%s code=%s reason=%s", label,
                                    exc.code, exc)
                    else:
                        self.reads += 1
                        publish(jobs)
                    with trio.move_on_after(self.refresh_s):
                        await self._changed.wait()
                    await trio.sleep(DEBOUNCE_S)  # let a burst of changes arrive
                    self._changed = trio.Event()
            finally:
                self.connected = False
                nursery.cancel_scope.cancel()
                await client.aclose()

    async def _watch(self, client: RpcClient, label: str) -> None:
        """Set ``_changed`` on every job status change; watch again after ``LAGGED``."""
        while True:
            try:
                async with client.stream(WATCH_JOBS, WatchJobs(snapshot=False)) as events:
                    async for _event in events:
                        self._changed.set()
            except RpcError as exc:
                if exc.code == "CHANNEL_CLOSED":
                    return
                log.warning("proxy.jobs_watch_ended ork=%s code=%s reason=%s", label,
                            exc.code, exc)
                if exc.code == "FORBIDDEN":  # not a client of wrk-ork: the list says so too
                    await trio.sleep(self.refresh_s)
                    continue
            self._changed.set()  # LAGGED or ended: read the list again at once
            await trio.sleep(1.0)


#: Pages of ``jobs.list`` read in one refresh (200 jobs each): a bound, not a limit
#: anyone should meet.
MAX_LIST_PAGES = 1000


async def _every_job(client: RpcClient) -> list[JobView]:
    """Every job wrk-ork has, a page at a time (one answer cannot hold thousands)."""
    jobs: list[JobView] = []
    after = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.call(LIST_JOBS, ListJobs(after=after), timeout_s=CALL_TIMEOUT_S)
        jobs.extend(page.jobs)
        if page.next is None:
            break
        after = page.next
    return jobs
