"""The proxy follows a real wrk-ork service (OrkService over its orchestrator) on a swarm:
a job becoming Active is routed, its agent keys come from the replica reports, a stopped
job is not routed any more, and wrk-ork refuses a proxy it does not list as a client."""

from __future__ import annotations

import httpx
import pytest
import trio

from nodes.proxy_inference.jobs import OrkJobSource
from p2p.keys import KeyPair
from p2p.swarm import Swarm
from tests.p2p.helpers import wait_until

from .harness import CHAT, inference_spec, proxy_world
from .ork_service import Ork
from .tiny_agent import TinyAgent

pytestmark = pytest.mark.slow


async def test_the_proxy_routes_what_wrk_ork_reports_active(tmp_path):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            ork = Ork({world.proxy_key.public_key})
            ork_swarm = Swarm(ork.keypair, config=world.swarm_config(), services=[ork.service])
            ork_address = await world.nursery.start(ork_swarm.run)
            _, secret = await world.add_key()
            proxy = await world.start_proxy(ork=ork.keypair.public_key,
                                            ork_addresses=[ork_address], job_source=None)
            await world.wait_replicated()
            job = ork.world.create(inference_spec("chat", replicas=2))
            ork.service.pump()
            agents = [KeyPair.generate(), KeyPair.generate()]
            tiny = [TinyAgent("a0"), TinyAgent("a1")]
            for key, agent in zip(agents, tiny, strict=True):
                await world.start_agent(key, [agent.service()], job.id)
            async with httpx.AsyncClient(base_url=proxy.url, timeout=20,
                                         headers={"Authorization": f"Bearer {secret}"}) as http:
                # Starting: not routed yet.
                assert (await http.post("/chat/completions", json=CHAT)).status_code == 404
                ork.report(job.id, 0, "active", (agents[0].public_key,))
                ork.report(job.id, 1, "active", (agents[1].public_key,))
                await wait_until(lambda: proxy.table.lookup("team-a", "chat") is not None,
                                 limit_s=10)
                await wait_until(lambda: len(proxy.pool.clients) == 2, limit_s=10)
                seen = [(await http.post("/chat/completions", json=CHAT)).json()["agent"]
                        for _ in range(4)]
                assert sorted(seen) == ["a0", "a0", "a1", "a1"]
                # One replica fails: the job is Degraded, still routed, to the other only.
                ork.report(job.id, 1, "failed", (agents[1].public_key,))
                await wait_until(lambda: proxy.table.lookup("team-a", "chat").endpoints
                                 == (agents[0].public_key,), limit_s=10)
                for _ in range(3):
                    response = await http.post("/chat/completions", json=CHAT)
                    assert response.json()["agent"] == "a0"
                assert (await http.get("/models")).json()["data"] == []  # Active only
                ork.report(job.id, 1, "active", (agents[1].public_key,))
                await wait_until(lambda: len(proxy.pool.clients) == 2, limit_s=10)
                models = (await http.get("/models")).json()["data"]
                assert [m["id"] for m in models] == ["chat"]
                # Deleted: gone from the table, and the agents are let go.
                ork.world.orch.delete_job(job.id, ork.world.now)
                ork.service.pump()
                await wait_until(lambda: proxy.table.lookup("team-a", "chat") is None,
                                 limit_s=10)
                assert (await http.post("/chat/completions", json=CHAT)).status_code == 404
                await wait_until(lambda: not proxy.pool.clients, limit_s=10)


async def test_a_proxy_wrk_ork_does_not_list_routes_nothing(tmp_path, caplog):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            ork = Ork({KeyPair.generate().public_key})  # proxies set, without this proxy
            ork_swarm = Swarm(ork.keypair, config=world.swarm_config(), services=[ork.service])
            ork_address = await world.nursery.start(ork_swarm.run)
            ork.world.create(inference_spec("chat"))
            proxy = await world.start_proxy(ork=ork.keypair.public_key,
                                            ork_addresses=[ork_address], job_source=None)
            await wait_until(lambda: any("FORBIDDEN" in r.getMessage()
                                         for r in caplog.records), limit_s=10)
            assert isinstance(proxy.job_source, OrkJobSource)
            assert proxy.table.jobs == {} and proxy.job_source.reads == 0
