"""app-node tells wrk-monitor its Loki, end to end on real sockets: a MonitorClient
(app-node's) given ``observability`` sets it when it connects; records pushed after
that land in the local Loki server (with basic-auth credentials in the URL, never
shown back), ``logs.query`` and the HTTP side return the history older than the
buffer from it, /metrics counts them; a restarted wrk-monitor reads what app-node
sent from its storage and pushes to Loki before app-node reconnects, and app-node
sends it again on the new connection."""

from __future__ import annotations

import logging
import time

import httpx
import pytest
import trio

from contracts.monitor import (
    PUSH,
    QUERY,
    Observability,
    PushBatch,
    Query,
    decode_batch,
    encode_batch,
    make_record,
)
from nodes.kit.monitor_client import MonitorClient
from nodes.monitor.daemon import RunningMonitor, serve_monitor
from nodes.monitor.settings import MonitorSettings
from p2p.keys import KeyPair
from p2p.swarm import Swarm, SwarmConfig, UpkeepPolicy
from tests.p2p.helpers import Stoppable, wait_until

from .loki_server import start_loki
from .support import metric

pytestmark = pytest.mark.slow

BASE_NS = time.time_ns() - 3600 * 10**9

TOKEN = "o" * 32


def rec(i: int):
    return make_record(f"line {i}", service="wrk-ork", job_id="j-1", time_ns=BASE_NS + i)


async def test_app_node_sets_loki_and_history_comes_back_from_it_across_a_restart(
        tmp_path, caplog):
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="nodes.kit.monitor_client")
    app_key = KeyPair.generate()
    (tmp_path / "monitor").mkdir()

    def settings(port: int) -> MonitorSettings:
        return MonitorSettings(storage=tmp_path / "monitor", host="127.0.0.1", port=port,
                               pushers=[app_key.public_key.hex()],
                               followers=[app_key.public_key.hex()],
                               buffer={"max_records": 5},
                               http={"host": "127.0.0.1", "port": 0, "token": TOKEN},
                               loki={"flush_interval_s": 0.01})

    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            loki = await start_loki(nursery)
            secret_url = loki.url.replace("http://", "http://ops:s3cret@")
            sent = Observability(loki_url=secret_url, prometheus_url="http://prom:9090")

            first = Stoppable()
            monitor: RunningMonitor = await first.start(nursery, serve_monitor, settings(0))
            assert monitor.observability.state().loki is False  # nothing configured yet
            swarm = Swarm(app_key, config=SwarmConfig(host="127.0.0.1"))
            await nursery.start(swarm.run)
            client = MonitorClient(swarm, monitor.swarm.keypair.public_key,
                                   addresses=[monitor.swarm_address], observability=sent,
                                   backoff=UpkeepPolicy(base_s=0.05, max_s=0.2))
            await nursery.start(client.run)
            await wait_until(lambda: client.observability_state is not None, limit_s=20)
            state = monitor.observability.state()
            assert (state.loki, state.origin, state.persisted) == (True, "app-node", True)
            assert state.loki_url == loki.url  # without the credentials
            assert client.observability_state == state

            records = [rec(i) for i in range(20)]
            assert (await client.call(PUSH, PushBatch(records=encode_batch(records)))
                    ).accepted == 20
            await wait_until(lambda: len(loki.entries()) == 20, limit_s=20)
            # httpx sent the URL's user and password as basic auth.
            auth = {p.headers.get("authorization") for p in loki.pushes}
            assert auth == {"Basic b3BzOnMzY3JldA=="}

            result = await client.call(QUERY, Query(job_id="j-1", limit=100))
            got = decode_batch(result.records)
            assert result.history == "loki" and not result.more
            assert [r.text for r in got] == [f"line {i}" for i in range(20)]
            assert [r.level for r in got] == [0] * 15 + [20] * 5  # Loki keeps no level
            async with httpx.AsyncClient(base_url=monitor.url, timeout=10,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                body = (await http.get("/jobs/j-1/logs", params={"limit": 100})).json()
                assert body["history"] == "loki" and len(body["records"]) == 20
                # Loki stores a push before the pusher reads its answer and counts it.
                await wait_until(lambda: monitor.observability.statistics().pushed >= 20,
                                 limit_s=20)
                assert metric((await http.get("/metrics")).text,
                              "monitor_loki_pushed_total") == 20
            assert "s3cret" not in caplog.text

            # wrk-monitor restarts on the same port: the file puts Loki back at once,
            # and app-node sends it again on its new connection.
            port = monitor.swarm_address[1]
            await first.stop()  # its storage lock and port released
            await wait_until(lambda: not client.connected, limit_s=20)
            connections = client.connections
            monitor = await nursery.start(serve_monitor, settings(port))
            state = monitor.observability.state()
            assert (state.loki, state.loki_url, state.origin) == (True, loki.url, "file")
            await wait_until(lambda: client.connections > connections, limit_s=30)
            await wait_until(lambda: monitor.observability.state().origin == "app-node",
                             limit_s=20)
            assert monitor.observability.swaps == 0  # the same Loki: the pusher stays
            await client.call(PUSH, PushBatch(records=encode_batch([rec(20)])))
            await wait_until(lambda: len(loki.entries()) == 21, limit_s=20)
            sends = [r for r in caplog.records
                     if r.getMessage().startswith("monitor_client.observability_sent")]
            assert [r.levelno for r in sends] == [logging.INFO, logging.DEBUG]
            nursery.cancel_scope.cancel()
