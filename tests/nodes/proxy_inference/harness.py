"""One helper to run proxy-inference for real around a small world on 127.0.0.1.

:func:`proxy_world` starts a DHT (real UDP), an app-node stand-in (a replica
of the shared database on its own swarm, admin, admitting the proxy's key),
and the proxy itself (:func:`serve_proxy`, real HTTP on a free port), with
the jobs given by hand (:class:`StaticJobSource`) unless the test passes its
own source. Agents are started by the tests (the real InferenceService, or
the tiny scripted one for error paths) with :meth:`ProxyWorld.start_agent`;
:func:`two_agents` starts two tiny ones behind a job and :func:`client` calls the
proxy with a key.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from contracts.inference import job_topic
from contracts.model import JobSpec, JobStatus
from contracts.ork import JobView, ReplicaStatus, ReplicaView
from crdt import DatabaseService, FsyncPolicy, PutApiKey, RevokeApiKey, run_database_service
from nodes.proxy_inference import ProxySettings, RunningProxy, StaticJobSource, serve_proxy
from nodes.proxy_inference.jobs import JobSource
from p2p.dht.testnet import Testnet, udp_testnet
from p2p.host import Service
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.metrics import ProcessMetrics
from p2p.swarm import Swarm, SwarmConfig
from tests.p2p.helpers import Stoppable, wait_until

from .tiny_agent import TinyAgent

IMAGE = "docker://registry.example/cosmicac/vllm:1"


def inference_spec(
    served_name: str, *, team: str = "team-a", replicas: int = 1, model: str = "demo"
) -> JobSpec:
    return JobSpec(
        name=served_name,
        team=team,
        type="inference",
        image=IMAGE,
        gpus=1,
        replicas=replicas,
        runtime="local",
        model=model,
        served_name=served_name,
    )


def job_view(
    job_id: str,
    spec: JobSpec,
    agents: Sequence[bytes],
    *,
    status: JobStatus = JobStatus.ACTIVE,
    replica_status: ReplicaStatus = ReplicaStatus.ACTIVE,
) -> JobView:
    """A job as wrk-ork shows it, one replica per agent."""
    return JobView(
        id=job_id,
        spec=spec,
        status=status,
        reason="",
        created_at=1000.0,
        updated_at=1000.0,
        rack=None,
        replicas=tuple(
            ReplicaView(
                index=i,
                status=replica_status,
                generation=0,
                placement=None,
                message="",
                agents=(key.hex(),),
            )
            for i, key in enumerate(agents)
        ),
    )


@dataclass
class ProxyWorld:
    root: Path
    nursery: trio.Nursery
    dht: Testnet
    admin: DatabaseService
    proxy_key: KeyPair
    jobs: StaticJobSource
    proxy: RunningProxy | None = None
    agents: dict[bytes, trio.CancelScope] = field(default_factory=dict)
    _proxy_task: Stoppable | None = None

    @property
    def bootstrap(self) -> tuple[tuple[str, int], ...]:
        return tuple(self.dht.bootstrap)

    def swarm_config(self) -> SwarmConfig:
        return SwarmConfig(host="127.0.0.1", bootstrap=self.bootstrap, lookup_max_s=2.0)

    async def add_key(self, team: str = "team-a", *, key_id: str | None = None) -> tuple[str, str]:
        """A new API key of ``team`` written by app-node; returns (id, secret)."""
        key_id = key_id or "key-" + secrets.token_hex(4)
        secret = "sk-" + secrets.token_urlsafe(24)
        await self.admin.db.append(
            [
                PutApiKey.with_secret(
                    key_id, team, "test", secret, ["inference"], int(time.time() * 1000)
                )
            ]
        )
        return key_id, secret

    async def revoke(self, key_id: str) -> None:
        await self.admin.db.append([RevokeApiKey(key_id, int(time.time() * 1000))])

    async def wait_replicated(self, limit_s: float = 15.0) -> None:
        """Until the proxy's replica holds everything app-node's holds."""
        assert self.proxy is not None
        proxy_db = self.proxy.recorder.db
        want = self.admin.db.key
        await wait_until(
            lambda: proxy_db.lengths.get(want, 0) >= self.admin.db.lengths.get(want, 0),
            limit_s=limit_s,
        )

    async def start_proxy(
        self,
        *,
        job_source: JobSource | str | None = "static",
        metrics: ProcessMetrics | None = None,
        **settings,
    ) -> RunningProxy:
        """Start the proxy; ``job_source`` None follows wrk-ork (``ork`` in ``settings``);
        ``metrics``: the process endpoint the proxy adds its registries to, as the daemon
        kit's (serve it with ``p2p.metrics.serve_metrics`` to scrape it). ``settings``
        win over the defaults here (e.g. ``replica_backoff_s``)."""
        config = ProxySettings(
            **{
                "storage": self.root / "proxy",
                "database": self.admin.db.bootstrap,
                "host": "127.0.0.1",
                "port": 0,
                "bootstrap": self.bootstrap,
                "fsync": False,
                "http": {"host": "127.0.0.1", "port": 0},
                "usage": {"flush_interval_s": 0.05},
                "replica_backoff_s": 0.5,
                **settings,
            }
        )
        (self.root / "proxy").mkdir(exist_ok=True)
        self._proxy_task = Stoppable()
        source = self.jobs if job_source == "static" else job_source
        self.proxy = await self._proxy_task.start(
            self.nursery, serve_proxy, config, job_source=source, metrics=metrics
        )
        return self.proxy

    async def stop_proxy(self) -> None:
        """Stop the proxy and wait for its cleanup (a restart reuses its storage)."""
        assert self._proxy_task is not None
        await self._proxy_task.stop()
        self.proxy = None

    async def start_agent(
        self, keypair: KeyPair, services: Sequence[Service], job_id: str
    ) -> Swarm:
        """A swarm serving ``services`` and announcing on the job's topic."""
        swarm = Swarm(keypair, config=self.swarm_config(), services=services)
        scope = trio.CancelScope()

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await swarm.run(task_status=task_status)

        await self.nursery.start(run)
        swarm.join(job_topic(job_id), server=True, client=False)
        self.agents[keypair.public_key] = scope
        return swarm

    def stop_agent(self, key: bytes) -> None:
        self.agents.pop(key).cancel()


@asynccontextmanager
async def proxy_world(root: Path, *, admit: bool = True) -> AsyncIterator[ProxyWorld]:
    """The DHT, app-node's replica and (after ``start_proxy``) the proxy; all stopped on exit."""
    # The proxy's identity is its storage's: made first so app-node can allow it.
    proxy_key = load_or_create_keypair(root / "proxy")
    async with udp_testnet(3) as dht, trio.open_nursery() as nursery:
        app_node = Swarm(
            KeyPair.generate(),
            config=SwarmConfig(host="127.0.0.1", bootstrap=tuple(dht.bootstrap), lookup_max_s=2.0),
        )
        await nursery.start(app_node.run)
        admin = await nursery.start(
            functools.partial(
                run_database_service,
                root / "app-node",
                swarm=app_node,
                allow=frozenset({proxy_key.public_key}) if admit else frozenset(),
                fsync=FsyncPolicy.NEVER,
            )
        )
        world = ProxyWorld(root, nursery, dht, admin, proxy_key, StaticJobSource())
        yield world
        nursery.cancel_scope.cancel()


CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def client(world, secret: str | None) -> httpx.AsyncClient:
    """An HTTP client of the proxy presenting ``secret`` as its key (none if None)."""
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    # verify=False: plain HTTP, so no CA bundle to load (~20 ms of CPU per client).
    return httpx.AsyncClient(base_url=world.proxy.url, headers=headers, timeout=20, verify=False)


async def two_agents(world, *, modes=("ok", "ok"), job_id="j-chat", name="chat"):
    """A tiny agent per mode serving ``job_id`` as ``name``; returns (keys, agents)
    once the proxy has dialled them all."""
    keys = [KeyPair.generate() for _ in modes]
    agents = [TinyAgent(f"agent{i}", mode) for i, mode in enumerate(modes)]
    for key, agent in zip(keys, agents, strict=True):
        await world.start_agent(key, [agent.service()], job_id)
    world.jobs.set([job_view(job_id, inference_spec(name), [k.public_key for k in keys])])
    pool = world.proxy.pool
    await wait_until(lambda: all(k.public_key in pool.clients for k in keys), limit_s=20)
    return keys, agents
