"""The entry point over real sockets on 127.0.0.1: routing, headers, bodies, streams, failures."""

from __future__ import annotations

import hashlib
from contextlib import asynccontextmanager

import httpx
import pytest
import trio

from nodes.entry import EntrySettings, Service, serve_entry
from tests.ports import free_port

from .upstream import Upstream, serving

pytestmark = pytest.mark.slow


@asynccontextmanager
async def entry_world(**settings):
    """app-node and proxy-inference stand-ins, and an entry point in front of them."""
    api, inference = Upstream("api"), Upstream("inference")
    with trio.fail_after(30):
        async with serving(api, inference), trio.open_nursery() as nursery:
            config = {"port": 0, "api_url": api.url, "inference_url": inference.url}
            config.update(settings)
            entry = await nursery.start(serve_entry, EntrySettings(**config))
            # verify=False: plain HTTP, so no CA bundle to load (~20 ms of CPU per client).
            async with httpx.AsyncClient(
                base_url=entry.url, trust_env=False, timeout=10, verify=False
            ) as client:
                yield client, api, inference, entry
            nursery.cancel_scope.cancel()


def header(echo: dict, name: str) -> list[str]:
    return [v for k, v in echo["headers"] if k == name]


async def test_api_keeps_its_prefix_and_inference_loses_it():
    async with entry_world() as (client, *_):
        api = (await client.get("/api/v1/jobs/echo", params={"team": "a b"})).json()
        assert (api["upstream"], api["raw_path"], api["query"]) == (
            "api",
            "/api/v1/jobs/echo",
            "team=a+b",
        )
        assert (await client.get("/api")).json()["raw_path"] == "/api"
        inference = (await client.post("/inference/v1/chat/echo", json={})).json()
        assert (inference["upstream"], inference["raw_path"]) == ("inference", "/v1/chat/echo")
        assert (await client.get("/inference")).json()["raw_path"] == "/"
        escaped = (await client.get("/inference/v1/a%2Fb/echo")).json()
        assert escaped["raw_path"] == "/v1/a%2Fb/echo"  # escapes pass untouched


async def test_other_paths_get_the_landing_page_on_get_and_head_only():
    async with entry_world() as (client, *_):
        for path in ("/", "/apis", "/jobs/42", "/inferencex"):
            page = await client.get(path)
            assert page.status_code == 200, path
            assert page.headers["content-type"].startswith("text/html")
            assert 'href="/api/docs"' in page.text
            assert (
                f"{client.base_url.scheme}://{client.base_url.netloc.decode()}/inference/v1"
                in page.text
            )
        head = await client.head("/")
        assert head.status_code == 200 and head.content == b""
        refused = await client.post("/anything", json={})
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "NOT_FOUND"


async def test_with_a_ui_every_other_path_and_method_goes_to_it_as_it_is():
    ui = Upstream("ui")
    async with serving(ui), entry_world(ui_url=ui.url) as (client, *_):
        for method, path in (
            ("GET", "/"),
            ("GET", "/jobs/42"),
            ("POST", "/login"),
            ("GET", "/apis/x%2Fy"),
        ):
            echo = (await client.request(method, path, params={"q": "1"})).json()
            assert (echo["upstream"], echo["method"]) == ("ui", method), path
            assert echo["raw_path"] == path and echo["query"] == "q=1"
            host = client.base_url.netloc.decode()
            assert header(echo, "x-forwarded-host") == [host]
            assert header(echo, "x-forwarded-proto") == ["http"]
        # The APIs keep their own routes.
        assert (await client.get("/api/echo")).json()["upstream"] == "api"


async def test_hop_by_hop_headers_are_dropped_and_forwarded_ones_set():
    async with entry_world() as (client, _, _, entry):
        echo = (
            await client.get(
                "/inference/v1/echo",
                headers={
                    "Connection": "keep-alive, X-Hop",
                    "X-Hop": "1",
                    "Keep-Alive": "timeout=5",
                    "Proxy-Authorization": "Basic eA==",
                    "TE": "trailers",
                    "Upgrade": "foo/1",
                    "X-Forwarded-For": "6.6.6.6",
                    "Authorization": "Bearer sk-1",
                    "X-Custom": "kept",
                },
            )
        ).json()
        names = {k for k, _ in echo["headers"]}
        for dropped in ("x-hop", "keep-alive", "proxy-authorization", "te", "upgrade"):
            assert dropped not in names, dropped
        assert header(echo, "x-forwarded-for") == ["127.0.0.1"]  # replaced, never trusted
        assert header(echo, "x-forwarded-proto") == ["http"]
        assert header(echo, "x-forwarded-host") == [f"127.0.0.1:{entry.address[1]}"]
        assert header(echo, "x-forwarded-prefix") == ["/inference"]
        assert header(echo, "authorization") == ["Bearer sk-1"]
        assert header(echo, "x-custom") == ["kept"]
        assert header(echo, "host") != [f"127.0.0.1:{entry.address[1]}"]  # the upstream's own
        assert "accept-encoding" in names  # the client's own, not one the proxy added
        hop = await client.get("/api/hop")
        assert hop.text == "hop" and hop.headers["x-kept"] == "yes"
        assert "keep-alive" not in hop.headers and "proxy-authenticate" not in hop.headers
        assert len(hop.headers.get_list("date")) == 1
        assert len(hop.headers.get_list("server")) == 1


async def test_a_2_mib_body_is_streamed_both_with_and_without_a_length():
    blob = bytes(range(256)) * (8 * 1024)  # 2 MiB
    assert len(blob) == 2 * 1024 * 1024

    async def chunks():
        for start in range(0, len(blob), 65536):
            yield blob[start : start + 65536]

    async with entry_world() as (client, *_):
        for content in (blob, chunks()):
            echo = (await client.post("/api/upload/echo", content=content)).json()
            assert echo["length"] == len(blob)
            assert echo["sha256"] == hashlib.sha256(blob).hexdigest()


async def test_a_body_beyond_the_limit_is_refused_with_413():
    async def chunks():
        for _ in range(32):
            yield b"x" * 65536

    async with entry_world(max_body_bytes=1024 * 1024) as (client, *_):
        declared = await client.post("/api/echo", content=b"x" * (2 * 1024 * 1024))
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "BODY_TOO_LARGE"
        # The rest of the body is never read: the connection is not pooled again.
        assert declared.headers.get("connection") == "close"
        try:
            streamed = await client.post("/api/echo", content=chunks())
        except httpx.TransportError:  # the door may close while the client still sends
            pass
        else:
            assert streamed.status_code == 413
            assert streamed.headers.get("connection") == "close"
        assert (await client.post("/api/echo", content=b"x" * 1024)).status_code == 200


async def test_server_sent_events_arrive_one_by_one():
    async with entry_world() as (client, _, inference, _):
        seen: list[tuple[str, float]] = []
        async with client.stream("GET", "/inference/v1/events") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    seen.append((line[6:], trio.current_time()))
                    inference.first_seen.set()  # lets the upstream send its last event
        assert [data for data, _ in seen] == ["0", "1", "2", "3", "4"]
        # The first event reached the client before the last one was even sent.
        assert seen[0][1] < inference.sent_at[-1]


async def test_a_client_that_leaves_cancels_the_upstream_stream():
    async with entry_world() as (client, _, inference, entry):
        async with client.stream("GET", "/inference/v1/forever") as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break
        with trio.fail_after(10):
            await inference.stream_ended.wait()
        metric = entry.app.metrics.requests.labels("inference", "0")
        with trio.fail_after(5):
            while metric._value.get() < 1:  # noqa: ASYNC110 - the handler counts on its way out
                await trio.sleep(0.01)


async def test_an_upstream_that_is_down_is_502_naming_the_service():
    down = f"http://127.0.0.1:{free_port()}"
    async with entry_world(inference_url=down, api_url=down) as (client, *_):
        for path, service, daemon in (
            ("/inference/v1/models", "inference", "proxy-inference"),
            ("/api/v1/jobs", "api", "app-node"),
        ):
            response = await client.get(path)
            assert response.status_code == 502
            error = response.json()["error"]
            assert (error["code"], error["service"]) == ("UPSTREAM_UNREACHABLE", service)
            assert daemon in error["message"]


async def test_the_monitor_is_503_until_configured_then_proxied():
    async with entry_world() as (client, *_):
        response = await client.get("/monitor/metrics")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "SERVICE_NOT_CONFIGURED"
        assert "COSMICAC_ENTRY__MONITOR_URL" in response.json()["error"]["message"]
    async with entry_world(monitor_url=f"http://127.0.0.1:{free_port()}") as (client, *_):
        response = await client.get("/monitor/logs")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "SERVICE_UNAVAILABLE"
    monitor = Upstream("monitor")
    async with serving(monitor), entry_world(monitor_url=monitor.url) as (client, *_):
        echo = (await client.get("/monitor/logs/echo")).json()
        assert (echo["upstream"], echo["raw_path"]) == ("monitor", "/logs/echo")


async def test_a_silent_upstream_is_504():
    async with entry_world(read_timeout_s=0.3) as (client, *_):
        response = await client.get("/api/v1/slow")
        assert response.status_code == 504
        error = response.json()["error"]
        assert (error["code"], error["service"]) == ("UPSTREAM_TIMEOUT", "api")


async def test_connections_to_an_upstream_are_pooled_and_kept_alive():
    async with entry_world() as (client, _, _, entry):
        for _ in range(5):
            assert (await client.get("/api/echo")).status_code == 200
        pool = entry.app.clients[Service.API]._transport._pool
        assert len(pool.connections) == 1  # five requests, one upstream connection
        # Counted as answered, not as clients gone (hypercorn reports a
        # disconnect as soon as each response is complete).
        answered = entry.app.metrics.requests.labels("api", "200")
        with trio.fail_after(5):
            while answered._value.get() < 5:  # noqa: ASYNC110 - counted on the way out
                await trio.sleep(0.01)
        assert entry.app.metrics.requests.labels("api", "0")._value.get() == 0


async def test_a_client_that_leaves_before_the_answer_abandons_the_upstream_request():
    async with entry_world() as (client, api, _, entry):
        with pytest.raises(httpx.ReadTimeout):
            await client.get("/api/v1/slow", timeout=0.3)  # the upstream answers after 5 s
        gone = entry.app.metrics.requests.labels("api", "0")
        with trio.fail_after(api.slow_s / 2):  # long before the upstream would answer
            while gone._value.get() < 1:  # noqa: ASYNC110 - counted on the way out
                await trio.sleep(0.01)
        pool = entry.app.clients[Service.API]._transport._pool
        assert pool.connections == []  # closed, not put back for another request


# -- the client's address, and uploads at once ----------------------------------------


async def test_a_trusted_proxy_in_front_is_appended_to_and_a_client_is_not():
    async with entry_world(trusted_proxies=["127.0.0.1"]) as (client, *_):
        # the test client plays a load balancer at 127.0.0.1 that saw 192.0.2.1,
        # behind which 6.6.6.6 is whatever the client itself wrote
        echo = (
            await client.get("/api/echo", headers={"X-Forwarded-For": "6.6.6.6, 192.0.2.1"})
        ).json()
        assert header(echo, "x-forwarded-for") == ["192.0.2.1, 127.0.0.1"]
    async with entry_world(trusted_proxies=["10.9.9.9"]) as (client, *_):
        echo = (await client.get("/api/echo", headers={"X-Forwarded-For": "6.6.6.6"})).json()
        assert header(echo, "x-forwarded-for") == ["127.0.0.1"]  # not a trusted peer


async def test_large_bodies_at_once_are_bounded():
    release, holding = trio.Event(), trio.Event()

    async def held():
        yield b"x" * 4096
        holding.set()
        await release.wait()
        yield b"x" * 4096

    async with entry_world(large_body_bytes=1024, max_large_bodies=1, busy_retry_after_s=2) as (
        client,
        *_,
    ):
        async with trio.open_nursery() as nursery:

            async def upload() -> None:
                echo = (await client.post("/api/upload/echo", content=held())).json()
                assert echo["length"] == 8192

            nursery.start_soon(upload)
            await holding.wait()
            async with httpx.AsyncClient(
                base_url=str(client.base_url), trust_env=False, timeout=10
            ) as other:
                busy = await other.post("/api/upload/echo", content=b"y" * 2048)
                assert busy.status_code == 503
                assert busy.json()["error"]["code"] == "SERVER_BUSY"
                assert busy.headers["retry-after"] == "2"
                # small bodies (chat requests) never wait for uploads
                small = await other.post("/api/upload/echo", content=b"z" * 512)
                assert small.status_code == 200
            release.set()
        # the slot came back with the body's last byte
        again = await client.post("/api/upload/echo", content=b"y" * 2048)
        assert again.status_code == 200 and again.json()["length"] == 2048
