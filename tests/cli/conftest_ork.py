"""``served_ork``: the ``served`` app-node of :mod:`tests.cli.test_account` wired to a
real in-process wrk-ork, for CLI tests of jobs, racks and nodes.

wrk-ork is an ``OrkService`` over the orchestrator of ``tests/nodes/ork/world.World``
(rack ``rack-1``: two 8-GPU nodes, n0 and n1) on its own swarm on 127.0.0.1; it
trusts app-node's key only, and app-node reaches it by its address through its
real ``OrkClient``. Nothing runs the jobs: a test plays the worker with
:meth:`ServedOrk.drive` while the CLI waits (it also pumps the service, as
wrk-ork's daemon does after each report, so app-node's watch sees the change and
``--wait`` following the job's events with it).

``served_logs`` adds a real wrk-monitor: a ``MonitorService`` over a ``LogBuffer``
on a third swarm that lets app-node's key follow, in app-node's settings
(``monitor``, ``monitor_addresses``); tests append records to ``log_buffer``.

Import the fixture into a test module: ``from .conftest_ork import served_ork``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from nodes.ork.service import OrkService
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.swarm import Swarm, SwarmConfig
from tests.nodes.ork.world import World
from tests.p2p.helpers import wait_until

from .test_account import Served, cli_env, serve

__all__ = ["ServedOrk", "served_logs", "served_ork"]


@dataclass
class ServedOrk(Served):
    world: World | None = None
    service: OrkService | None = None
    #: With ``served_logs``: wrk-monitor's buffer.
    log_buffer: LogBuffer | None = None
    #: With ``served_logs``: wrk-monitor's service (its ``health`` book takes reports).
    monitor_service: MonitorService | None = None

    def job_ids(self) -> set[str]:
        assert self.world is not None
        return {job.id for job in self.world.orch.list_jobs(None)}

    async def new_job(self, known: set[str]) -> str:
        """Wait until wrk-ork has a job not in ``known`` (a CLI process creates it)."""
        await wait_until(lambda: bool(self.job_ids() - known), limit_s=30)
        [job] = self.job_ids() - known
        return job

    def drive(self, job: str, state: str, replicas: Iterable[int] | None = None,
              message: str = "") -> None:
        """The worker reports ``state`` for the job's replicas (every one by default)."""
        assert self.world is not None
        indexes = replicas if replicas is not None else \
            [r.index for r in self.world.orch.get_job(job).replicas]
        for index in indexes:
            self.world.say(index, state, job=job, message=message)
        if self.service is not None:
            self.service.pump()

    async def login_as(self, email: str, password: str, config: Path) -> dict[str, str]:
        """The CLI environment of a session of ``email`` kept in ``config`` (logged
        in over HTTP: a second `cosmicac login` would cost a process)."""
        async with httpx.AsyncClient(base_url=f"{self.server}/api", timeout=30) as api:
            r = await api.post("/auth/login", json={"email": email, "password": password})
        assert r.status_code == 200, r.text
        session = json.dumps({"server": self.server, "token": r.json()["token"],
                              "expires_at": time.time() + 3600, "email": email})
        await trio.Path(config).mkdir(parents=True, exist_ok=True)
        await trio.Path(config / "session.json").write_text(session)
        return cli_env(config, self.server)


@pytest.fixture
async def served_ork(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[ServedOrk]:
    yield await _serve_ork(tmp_path, nursery, monitor=False)
    nursery.cancel_scope.cancel()


@pytest.fixture
async def served_logs(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[ServedOrk]:
    yield await _serve_ork(tmp_path, nursery, monitor=True)
    nursery.cancel_scope.cancel()


async def _serve_ork(tmp_path: Path, nursery: trio.Nursery, *, monitor: bool) -> ServedOrk:
    world = World(nodes=(8, 8))
    # app-node's identity made first, so wrk-ork can trust exactly that key.
    app_key = await trio.to_thread.run_sync(load_or_create_keypair, tmp_path / "app-node")
    ork_key = KeyPair.generate()
    service = OrkService(world.orch, allow=lambda key: key == app_key.public_key,
                         clock=lambda: world.now)
    ork_swarm = Swarm(ork_key, config=SwarmConfig(host="127.0.0.1", port=0),
                      services=[service])
    with trio.fail_after(30):
        address = await nursery.start(ork_swarm.run)
    extra: dict = {}
    buffer = monitor_service = None
    if monitor:
        buffer = LogBuffer()
        monitor_service = MonitorService(buffer, followers={app_key.public_key})
        monitor_swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", port=0),
                              services=[monitor_service])
        with trio.fail_after(30):
            monitor_address = await nursery.start(monitor_swarm.run)
        extra = {"monitor": monitor_swarm.keypair.public_key,
                 "monitor_addresses": (monitor_address,)}
    served = await serve(tmp_path, nursery, ork=ork_key.public_key, ork_addresses=(address,),
                         **extra)
    return ServedOrk(served.node, served.server, served.env, served.config, world, service,
                     buffer, monitor_service)

