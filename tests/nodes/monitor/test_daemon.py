"""wrk-monitor as a daemon on real sockets: a LogShipper on another swarm ships
records, the HTTP side serves them as JSON and live over SSE, Loki gets them with
their labels and serves the history older than the buffer, /metrics counts them,
and the bearer token guards every route (/metrics too: wrk-monitor without one
serves nothing); a proxy's health reports are judged with the settings' thresholds
and forwarded on /metrics."""

from __future__ import annotations

import functools
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from contracts.monitor import APPLICATION, make_record
from nodes.monitor.daemon import RunningMonitor, serve_monitor
from nodes.monitor.settings import MonitorSettings
from nodes.proxy_inference.health import HealthWindow
from nodes.proxy_inference.reporter import HealthReporter
from p2p.keys import KeyPair
from p2p.swarm import Swarm, SwarmConfig
from runtime.log_shipper import LogShipper
from tests.p2p.helpers import wait_until

from .loki_server import start_loki
from .support import metric

pytestmark = pytest.mark.slow

TOKEN = "t" * 32
#: A base far enough in the past that "now" never falls inside the test's records.
BASE_NS = time.time_ns() - 3600 * 10**9


@dataclass
class World:
    monitor: RunningMonitor
    shipper: LogShipper
    http: httpx.AsyncClient


@asynccontextmanager
async def world(tmp_path, **settings):
    """wrk-monitor serving, a shipper on its own swarm connected to it, an HTTP client
    (sending the operator's token, unless ``http`` says otherwise)."""
    shipper_key = KeyPair.generate()
    (tmp_path / "monitor").mkdir()
    http = {"host": "127.0.0.1", "port": 0, "token": TOKEN, **settings.pop("http", {})}
    config = MonitorSettings(
        storage=tmp_path / "monitor",
        host="127.0.0.1",
        port=0,
        pushers=[shipper_key.public_key.hex()],
        http={k: v for k, v in http.items() if v is not None},
        **settings,
    )
    async with trio.open_nursery() as nursery:
        monitor: RunningMonitor = await nursery.start(serve_monitor, config)
        swarm = Swarm(shipper_key, config=SwarmConfig(host="127.0.0.1"))
        await nursery.start(swarm.run)
        shipper = LogShipper(flush_interval_s=0.01, retry_s=0.1)
        nursery.start_soon(
            functools.partial(
                shipper.run,
                swarm,
                monitor.swarm.keypair.public_key,
                addresses=[monitor.swarm_address],
            )
        )
        headers = {"Authorization": f"Bearer {TOKEN}"} if config.http.token else {}
        # verify=False: plain HTTP, so no CA bundle to load (~20 ms of CPU per client).
        async with httpx.AsyncClient(
            base_url=monitor.url, timeout=10, headers=headers, verify=False
        ) as client:
            yield World(monitor, shipper, client)
        nursery.cancel_scope.cancel()


def rec(i: int, *, job: str = "j-1", source: str = "System"):
    return make_record(
        f"line {i}", service="wrk-ork", job_id=job, source=source, time_ns=BASE_NS + i
    )


async def ship(w: World, records) -> None:
    before = w.monitor.service.buffer.stats.received
    for record in records:
        w.shipper.offer(record)
    await wait_until(
        lambda: w.monitor.service.buffer.stats.received >= before + len(records), limit_s=20
    )


def texts(body) -> list[str]:
    return [r["text"] for r in body["records"]]


async def test_shipped_records_are_served_as_json_and_counted(tmp_path):
    with trio.fail_after(60):
        async with world(tmp_path) as w:
            await ship(w, [rec(0), rec(1, source=APPLICATION), rec(2, job="j-2"), rec(3)])
            body = (await w.http.get("/jobs/j-1/logs")).json()
            assert texts(body) == ["line 0", "line 1", "line 3"]
            assert body["history"] == "buffer"
            assert body["records"][1] | {"seq": 0} == {
                "time_ns": BASE_NS + 1,
                "job_id": "j-1",
                "replica": None,
                "source": APPLICATION,
                "level": 20,
                "service": "wrk-ork",
                "text": "line 1",
                "seq": 0,
            }
            # Behind the entry point or not: the /monitor prefix serves the same.
            body = (
                await w.http.get("/monitor/jobs/j-1/logs", params={"source": "System", "limit": 1})
            ).json()
            assert texts(body) == ["line 3"]
            body = (await w.http.get("/jobs/j-1/logs", params={"since": BASE_NS + 1})).json()
            assert texts(body) == ["line 1", "line 3"]
            assert (await w.http.get("/jobs/j-1/logs", params={"limit": 0})).status_code == 400
            assert (await w.http.get("/jobs/j-1/logs", params={"source": "x"})).status_code == 400
            text = (await w.http.get("/metrics")).text
            assert metric(text, "monitor_records_received_total") == 4
            assert metric(text, "monitor_buffer_records") == 4
            assert metric(text, "process_cpu_seconds_total") > 0
            assert "swarm_connections" in text
            assert (await w.http.get("/monitor/metrics")).status_code == 200


async def _events(response: httpx.Response):
    """(kind, payload) of each SSE event or comment, as they come."""
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line.startswith("event: "):
            yield "event", line[7:]
        elif line.startswith("data: "):
            yield "data", json.loads(line[6:])


async def test_follow_sees_the_snapshot_then_a_record_pushed_after_it_connected(tmp_path):
    with trio.fail_after(60):
        async with world(tmp_path) as w:
            w.monitor.front.keepalive_s = 0.2
            await ship(w, [rec(0), rec(1, job="j-2")])
            seen: list[str] = []
            comments: list[str] = []
            async with w.http.stream("GET", "/jobs/j-1/logs", params={"follow": "1"}) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                async for kind, payload in _events(response):
                    if kind == "comment":
                        comments.append(payload)
                        if "keep-alive" in payload and not seen[1:]:
                            w.shipper.offer(rec(2))  # after a keep-alive: live, not snapshot
                    elif kind == "data":
                        seen.append(payload["text"])
                        if len(seen) == 2:
                            break
            assert seen == ["line 0", "line 2"]
            assert "keep-alive" in comments
            await wait_until(
                lambda: w.monitor.front.streams == 0 and w.monitor.service.buffer.followers == 0
            )


async def test_a_follower_that_falls_behind_gets_lagged_and_the_end(tmp_path):
    with trio.fail_after(60):
        async with world(tmp_path, buffer={"queue_records": 3}) as w:
            buffer = w.monitor.service.buffer
            async with w.http.stream("GET", "/jobs/j-1/logs", params={"follow": "1"}) as response:
                lines = response.aiter_lines()
                assert (await lines.__anext__()).startswith(":")  # attached
                await wait_until(lambda: buffer.followers == 1)
                buffer.append([rec(i) for i in range(10)])  # more than its queue at once
                rest = [line async for line in lines]
            assert "event: lagged" in rest
            assert buffer.stats.followers_lagged == 1


async def test_records_reach_loki_and_history_older_than_the_buffer_comes_back(tmp_path):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            loki = await start_loki(nursery)
            async with world(
                tmp_path,
                buffer={"max_records": 5},
                loki={"url": loki.url, "flush_interval_s": 0.01},
            ) as w:
                await ship(
                    w, [rec(i, source=APPLICATION if i % 2 else "System") for i in range(20)]
                )
                await wait_until(lambda: len(loki.entries()) == 20, limit_s=20)
                labels = {dict(labels)["source"]: dict(labels) for labels, _, _ in loki.entries()}
                assert labels["System"] == {
                    "service": "wrk-ork",
                    "source": "System",
                    "job_id": "j-1",
                }
                assert labels[APPLICATION]["job_id"] == "j-1"
                body = (await w.http.get("/jobs/j-1/logs", params={"limit": 100})).json()
                assert body["history"] == "loki"
                assert texts(body) == [f"line {i}" for i in range(20)]
                assert [r["seq"] is None for r in body["records"]] == [True] * 15 + [False] * 5
                body = (
                    await w.http.get("/jobs/j-1/logs", params={"limit": 100, "source": APPLICATION})
                ).json()
                assert texts(body) == [f"line {i}" for i in range(1, 20, 2)]
                # A late record (older than the ring's first) is in both: served once.
                await ship(w, [rec(-5)])
                await wait_until(lambda: len(loki.entries()) == 21, limit_s=20)
                body = (await w.http.get("/jobs/j-1/logs", params={"limit": 100})).json()
                assert texts(body) == [f"line {i}" for i in [*range(20), -5]]
                # Loki stores the last push before the pusher reads its answer and
                # counts it: wait for the pusher's side, not only Loki's copy.
                await wait_until(
                    lambda: w.monitor.observability.statistics().pushed >= 21, limit_s=20
                )
                text = (await w.http.get("/metrics")).text
                assert metric(text, "monitor_loki_pushed_total") == 21
                assert metric(text, "monitor_records_evicted_total") == 16
            nursery.cancel_scope.cancel()


async def test_the_token_guards_every_route_metrics_too(tmp_path):
    with trio.fail_after(60):
        async with world(tmp_path) as w:
            await ship(w, [rec(0)])
            stranger = httpx.AsyncClient(base_url=w.monitor.url, timeout=10)
            for path in (
                "/jobs/j-1/logs",
                "/jobs/j-1/logs?follow=1",
                "/metrics",
                "/monitor/metrics",
                "/jobs/j-1/metrics",
            ):
                for auth in (
                    None,
                    "Bearer " + "x" * 32,
                    f"Basic {TOKEN}",
                    TOKEN,
                    f"Bearer {TOKEN}x",
                    f"Bearer {TOKEN[:-1]}",
                ):
                    refused = await stranger.get(
                        path, headers={"Authorization": auth} if auth else {}
                    )
                    assert refused.status_code == 401, (path, auth)
                    assert refused.headers["www-authenticate"] == "Bearer"
                    assert refused.json()["error"]["code"] == "UNAUTHORIZED"
            await stranger.aclose()
            good = await w.http.get("/monitor/jobs/j-1/logs")
            assert texts(good.json()) == ["line 0"]
            assert (await w.http.get("/metrics")).status_code == 200


async def test_a_monitor_without_a_token_serves_nothing_over_http(tmp_path):
    """Fail closed: no ``http.token`` is not an open HTTP side."""
    with trio.fail_after(60):
        async with world(tmp_path, http={"token": None}) as w:
            await ship(w, [rec(0)])
            for path in (
                "/metrics",
                "/monitor/metrics",
                "/jobs/j-1/logs",
                "/monitor/jobs/j-1/logs?follow=1",
                "/jobs/j-1/metrics",
            ):
                for headers in ({}, {"Authorization": "Bearer " + "t" * 32}):
                    refused = await w.http.get(path, headers=headers)
                    assert refused.status_code == 403, path
                    error = refused.json()["error"]
                    assert error["code"] == "HTTP_TOKEN_NOT_SET"
                    assert "http.token_file" in error["message"]
                    assert "line 0" not in refused.text and "j-1" not in refused.text


def test_newest_scans_from_the_newest_end_and_keeps_arrival_order():
    from nodes.monitor._buffer import LogBuffer

    buffer = LogBuffer(max_records=6)
    assert buffer.first is None and buffer.newest(lambda r: True, 3) == []
    buffer.append([rec(i, job="j-1" if i % 2 else "j-2") for i in range(8)])
    assert buffer.first == rec(2, job="j-2")
    newest = buffer.newest(lambda r: r.job_id == "j-1", 2)
    assert [(seq, r.text) for seq, r in newest] == [(6, "line 5"), (8, "line 7")]
    assert [r.text for _, r in buffer.newest(lambda r: r.job_id == "j-1", 10)] == [
        "line 3",
        "line 5",
        "line 7",
    ]


async def test_a_busy_http_port_is_named(tmp_path):
    import socket

    from nodes.kit.peer import HttpBindError

    (tmp_path / "m").mkdir()
    with socket.socket() as busy, trio.fail_after(30):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = MonitorSettings(
            storage=tmp_path / "m",
            host="127.0.0.1",
            port=0,
            http={"host": "127.0.0.1", "port": port},
        )
        with pytest.raises(BaseException) as caught:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_monitor, config)
    leaf = caught.value
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, HttpBindError)
    assert str(leaf) == f"cannot serve HTTP on 127.0.0.1:{port}: Address already in use"


async def test_a_proxys_reports_are_judged_with_the_settings_and_shown_on_metrics(tmp_path):
    with trio.fail_after(60):
        # Strict thresholds from settings: one failure in ten is Unhealthy.
        async with world(
            tmp_path, health={"unhealthy_error_rate": 0.1, "degraded_error_rate": 0.05}
        ) as w:
            window = HealthWindow()
            reporter = HealthReporter(window, routed=lambda: ["j-idle"], interval_s=0.05)
            now = time.perf_counter()
            for i in range(10):
                window.record(
                    "j-1", 502 if i == 0 else 200, now, error=i == 0, first_byte_s=0.03, total_s=0.4
                )
            proxy = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1"))
            w.monitor.service.proxies.add(proxy.keypair.public_key)
            async with trio.open_nursery() as nursery:
                await nursery.start(proxy.run)
                nursery.start_soon(
                    reporter.run,
                    proxy,
                    w.monitor.swarm.keypair.public_key,
                    [w.monitor.swarm_address],
                )
                await wait_until(lambda: w.monitor.service.health.accepted >= 1, limit_s=20)
                text = (await w.http.get("/metrics")).text
                nursery.cancel_scope.cancel()
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
            }
            assert (
                samples[("cosmicac_model_health", (("health", "Unhealthy"), ("job_id", "j-1")))]
                == 1
            )
            assert (
                samples[("cosmicac_model_health", (("health", "Healthy"), ("job_id", "j-idle")))]
                == 1
            )
            assert (
                samples[("cosmicac_proxy_requests_total", (("job_id", "j-1"), ("status", "200")))]
                == 9
            )
            assert samples[("cosmicac_monitor_metrics_senders", ())] == 1
            assert "monitor_buffer_records" in text  # its own, alongside


@asynccontextmanager
async def door(monitor: RunningMonitor):
    """The entry point in front of ``monitor`` (as `cosmicac up` puts it), and a stranger's
    HTTP client to it (no credentials)."""
    from nodes.entry import EntrySettings, serve_entry

    async with trio.open_nursery() as nursery:
        entry = await nursery.start(
            serve_entry,
            EntrySettings(
                port=0,
                api_url="http://127.0.0.1:9",
                inference_url="http://127.0.0.1:9",
                monitor_url=monitor.url,
            ),
        )
        async with httpx.AsyncClient(
            base_url=entry.url, trust_env=False, timeout=10, verify=False
        ) as stranger:  # plain HTTP
            yield stranger
        nursery.cancel_scope.cancel()


async def test_nobody_reads_logs_or_metrics_through_the_door_without_the_token(tmp_path):
    """Regression: /monitor/metrics named every team's jobs and
    /monitor/jobs/{id}/logs served their records (shell commands included) to anyone."""
    with trio.fail_after(60):
        async with world(tmp_path) as w, door(w.monitor) as stranger:
            await ship(w, [rec(0, job="team-a-job")])
            for path in (
                "/monitor/metrics",
                "/monitor/jobs/team-a-job/logs",
                "/monitor/jobs/team-a-job/logs?follow=1",
                "/monitor/jobs/team-a-job/metrics",
            ):
                refused = await stranger.get(path)
                assert refused.status_code == 401, path
                assert "team-a-job" not in refused.text and "line 0" not in refused.text
            # The operator's token passes the door (the entry forwards Authorization).
            good = await stranger.get(
                "/monitor/jobs/team-a-job/logs", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert texts(good.json()) == ["line 0"]


async def test_a_monitor_without_a_token_refuses_through_the_door_too(tmp_path):
    with trio.fail_after(60):
        async with world(tmp_path, http={"token": None}) as w, door(w.monitor) as stranger:
            await ship(w, [rec(0)])
            for path in ("/monitor/metrics", "/monitor/jobs/j-1/logs"):
                refused = await stranger.get(path)
                assert refused.status_code == 403
                assert refused.json()["error"]["code"] == "HTTP_TOKEN_NOT_SET"


async def test_one_client_cannot_take_every_follow_stream(tmp_path):
    """Per client (the address a trusted proxy forwards), with room left for others."""
    http = {"max_followers": 4, "max_followers_per_client": 2, "trusted_proxies": ["127.0.0.1"]}
    with trio.fail_after(60):
        async with world(tmp_path, http=http) as w, trio.open_nursery() as nursery:
            front = w.monitor.front
            opened = trio.Semaphore(0)

            async def hold(client: str) -> None:
                async with w.http.stream(
                    "GET",
                    "/jobs/j-1/logs",
                    params={"follow": "1"},
                    headers={"X-Forwarded-For": client},
                ) as response:
                    assert response.status_code == 200
                    lines = response.aiter_lines()  # kept: a dropped one closes the stream
                    await lines.__anext__()  # attached
                    opened.release()
                    await trio.sleep_forever()

            for _ in range(2):
                nursery.start_soon(hold, "198.51.100.1")
            for _ in range(2):
                await opened.acquire()
            refused = await w.http.get(
                "/jobs/j-1/logs",
                params={"follow": "1"},
                headers={"X-Forwarded-For": "198.51.100.1"},
            )
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "TOO_MANY_FOLLOWERS"
            assert "max_followers_per_client" in refused.json()["error"]["message"]
            nursery.start_soon(hold, "203.0.113.5")  # another client still gets one
            await opened.acquire()
            assert front.client_streams == {"198.51.100.1": 2, "203.0.113.5": 1}
            nursery.cancel_scope.cancel()
        await wait_until(
            lambda: (
                front.streams == 0
                and front.client_streams == {}
                and w.monitor.service.buffer.followers == 0
            )
        )


async def test_a_forged_forwarded_for_from_an_untrusted_peer_is_ignored(tmp_path):
    http = {"max_followers": 4, "max_followers_per_client": 1}
    with trio.fail_after(60):
        async with (
            world(tmp_path, http=http) as w,
            w.http.stream(
                "GET",
                "/jobs/j-1/logs",
                params={"follow": "1"},
                headers={"X-Forwarded-For": "198.51.100.1"},
            ) as held,
        ):
            lines = held.aiter_lines()  # kept: a dropped one closes the stream
            await lines.__anext__()
            again = await w.http.get(
                "/jobs/j-1/logs",
                params={"follow": "1"},
                headers={"X-Forwarded-For": "198.51.100.2"},
            )
            assert again.status_code == 503  # the peer is the client: 127.0.0.1


async def test_a_request_body_is_refused_unread(tmp_path):
    """The headers announce 64 MiB that are never sent: the answer comes at once."""
    with trio.fail_after(60):
        async with world(tmp_path) as w:
            host, port = w.monitor.http_address
            for framing in (b"Content-Length: 67108864", b"Transfer-Encoding: chunked"):
                stream = await trio.open_tcp_stream(host, port)
                async with stream:
                    await stream.send_all(
                        b"GET /metrics HTTP/1.1\r\nHost: m\r\n"
                        b"Authorization: Bearer " + TOKEN.encode() + b"\r\n" + framing + b"\r\n\r\n"
                    )
                    answer = b""
                    while b"\r\n\r\n" not in answer:
                        chunk = await stream.receive_some(65536)
                        assert chunk, answer
                        answer += chunk
                assert answer.startswith(b"HTTP/1.1 413"), answer
                assert b"BODY_NOT_ALLOWED" in answer or b"content-length" in answer.lower()
