"""The proxy's health window over real sockets: what each request path records (answered,
a stream broken midway, a 502, no replica: errors; a client's 4xx: nothing), and the
daemon, given ``telemetry.monitor``, pushing it to a real wrk-monitor service that then
judges the job's model health (over its own channel: the log shipper holds the
protocol's default one on the same connection)."""

from __future__ import annotations

import pytest
import trio

from contracts.monitor import ModelHealth
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from p2p.keys import KeyPair
from p2p.swarm import Swarm
from tests.p2p.helpers import wait_until

from .harness import CHAT, client, proxy_world, two_agents

pytestmark = pytest.mark.slow


async def test_every_path_lands_in_the_window_and_reaches_wrk_monitor(tmp_path):
    with trio.fail_after(90):
        async with proxy_world(tmp_path) as world:
            service = MonitorService(LogBuffer(), proxies={world.proxy_key.public_key})
            monitor = Swarm(KeyPair.generate(), config=world.swarm_config(), services=[service])
            monitor_address = await world.nursery.start(monitor.run)
            _, secret = await world.add_key()
            proxy = await world.start_proxy(telemetry={
                "monitor": monitor.keypair.public_key, "monitor_addresses": [monitor_address]})
            assert proxy.reporter is not None and proxy.front.health is not None
            proxy.reporter.interval_s = 0.1
            await world.wait_replicated()
            _, agents = await two_agents(world, modes=("ok",))
            async with client(world, secret) as http:
                for _ in range(4):
                    assert (await http.post("/chat/completions", json=CHAT)).status_code == 200
                async with http.stream("POST", "/chat/completions",
                                       json={**CHAT, "stream": True}) as response:
                    assert response.status_code == 200
                    await response.aread()
                # A client's mistakes say nothing of the model: not recorded.
                assert (await http.post("/chat/completions", content=b"{")).status_code == 400
                response = await http.post("/chat/completions", json={**CHAT, "model": "x"})
                assert response.status_code == 404
                agents[0].mode = "break"
                async with http.stream("POST", "/chat/completions",
                                       json={**CHAT, "stream": True}) as response:
                    assert response.status_code == 200  # then an error event
                    await response.aread()
                assert (await http.post("/chat/completions", json=CHAT)).status_code == 502
                agents[0].mode = "unavailable"
                assert (await http.post("/chat/completions", json=CHAT)).status_code == 503

            def figures():
                return service.health.merged(service.clock()).get("j-chat")

            await wait_until(lambda: figures() is not None and figures().requests == 8,
                             limit_s=20)
            got = figures()
            assert got is not None and got.errors == 3  # broken stream, 502, 503
            assert sum(got.first_byte_ms) == 7  # all but the 503 got a first frame
            assert sum(got.total_ms) == 5  # only the answered ones have a total
            assert got.requests_total == {"200": 6, "502": 1, "503": 1}
            [judged] = service.health.health(["j-chat"], service.clock())
            assert judged.health is ModelHealth.UNHEALTHY  # 3 of 8 failed
            # wrk-monitor takes a report before the proxy reads its answer and counts it.
            await wait_until(lambda: proxy.reporter.sent >= 1, limit_s=20)
            assert service.last_report_at is not None
