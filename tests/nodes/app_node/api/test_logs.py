"""A job's logs through app-node from a real in-process wrk-monitor (``logs_api``):
records come back filtered by job, source and since, newest ``limit``; follow
(over the lean server on 127.0.0.1: httpx's ASGI transport would buffer a stream)
sends the buffer's records then one appended after it connected; another team's
member 404; bad query 422; without wrk-monitor 503 ``MONITOR_UNAVAILABLE``; a
follow whose wrk-monitor stops ends with ``lagged``, and then 503 (unreachable)."""

from __future__ import annotations

import pytest
import trio

from contracts.monitor import APPLICATION, SYSTEM, make_record
from nodes.app_node.api import _events, _logs
from nodes.app_node.api._app import openapi

from .apis import Api, bearer
from .support import Events, _create, events, served

NS = 1_000_000_000


def _append(api: Api, job: str, texts: list[str], *, source: str = SYSTEM,
            at: float | None = None) -> None:
    assert api.log_buffer is not None
    at = api.clock.now if at is None else at
    api.log_buffer.append([make_record(t, service="agent-inference", source=source, job_id=job,
                                       replica=0, time_ns=int(at * NS) + i)
                           for i, t in enumerate(texts)])


async def test_logs_are_filtered_by_job_source_since_and_limit(logs_api: Api) -> None:
    api = logs_api
    owner = await api.signup()
    job = (await _create(api, owner))["id"]
    _append(api, job, ["old"], at=api.clock.now - 3600)
    _append(api, job, ["booting", "pulled"])
    _append(api, job, ["GET /v1/models 200"], source=APPLICATION)
    _append(api, "someone-else", ["not mine"])
    path = f"/api/jobs/{job}/logs"
    with trio.fail_after(30):
        r = await api.client.get(path, headers=bearer(owner))
        assert r.status_code == 200, r.text
        body = r.json()
        assert [x["text"] for x in body["records"]] == ["old", "booting", "pulled",
                                                         "GET /v1/models 200"]
        assert body["more"] is False
        first = body["records"][1]
        assert first["job_id"] == job and first["replica"] == 0
        assert first["source"] == "system" and first["level"] == "INFO"
        assert first["service"] == "agent-inference" and first["time"].endswith("Z")

        r = await api.client.get(path, headers=bearer(owner),
                                 params={"source": "application"})
        assert [x["text"] for x in r.json()["records"]] == ["GET /v1/models 200"]
        r = await api.client.get(path, headers=bearer(owner), params={"since": "10m"})
        assert [x["text"] for x in r.json()["records"]] == ["booting", "pulled",
                                                            "GET /v1/models 200"]
        r = await api.client.get(path, headers=bearer(owner), params={"limit": "2"})
        assert [x["text"] for x in r.json()["records"]] == ["pulled", "GET /v1/models 200"]
        assert r.json()["more"] is True

        for bad in ({"source": "kernel"}, {"since": "yesterday"}, {"limit": "0"},
                    {"follow": "2"}, {"since": "2026-01-01T00:00:00"}):
            r = await api.client.get(path, headers=bearer(owner), params=bad)
            assert r.status_code == 422, bad


def test_since_takes_durations_and_rfc3339() -> None:
    assert _logs.parse_since("90", 1000.0) == 910 * NS
    assert _logs.parse_since("10m", 1000.0) == 400 * NS
    assert _logs.parse_since("1d", 10.0) == 0
    assert _logs.parse_since("1970-01-01T00:01:00Z", 0.0) == 60 * NS
    assert _logs.parse_since("1970-01-01T01:01:00+01:00", 0.0) == 60 * NS


async def test_another_team_gets_404(logs_api: Api) -> None:
    api = logs_api
    owner = await api.signup()
    job = (await _create(api, owner))["id"]
    r = await api.client.post("/api/teams", headers=bearer(owner), json={"name": "other"})
    stranger = await api.user("s@example.com", r.json()["id"], "owner", owner)
    for path in (f"/api/jobs/{job}/logs", "/api/jobs/no-such-job/logs",
                 f"/api/jobs/{job}/logs?follow=1"):
        r = await api.client.get(path, headers=bearer(stranger))
        assert r.status_code == 404 and r.json()["error"]["field"] == "job"
    assert (await api.client.get(f"/api/jobs/{job}/logs")).status_code == 401


async def test_without_wrk_monitor_it_is_503(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    job = (await _create(api, owner))["id"]
    for query in ("", "?follow=1"):
        r = await api.client.get(f"/api/jobs/{job}/logs{query}", headers=bearer(owner))
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "MONITOR_UNAVAILABLE" and "not configured" in error["message"]


async def keepalives(stream: Events, n: int) -> None:
    """Read ``stream`` until ``n`` more keep-alive comments came, and nothing else.

    Waits for them rather than sleeping a fixed time: on a busy machine a 0.2 s
    sleep may see one 0.05 s keep-alive only (each is re-armed after the last).
    """
    wanted = stream.comments + n
    with trio.fail_after(10):
        async for line in stream.lines:
            if line.startswith(":"):
                stream.comments += 1
                if stream.comments >= wanted:
                    return
            else:
                assert not line, line  # no event while nothing was appended
    raise AssertionError("the stream ended")


async def test_follow_sends_the_buffer_then_live_records(logs_api: Api,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    api = logs_api
    monkeypatch.setattr(_logs, "KEEPALIVE_S", 0.05)
    owner = await api.signup()
    job = (await _create(api, owner))["id"]
    _append(api, job, ["before"])
    _append(api, job, ["app line"], source=APPLICATION)
    with trio.fail_after(30):
        async with served(api) as client, \
                events(client, f"/jobs/{job}/logs?follow=1&source=system", owner) as stream:
            kind, data = await stream.next()
            assert kind == "records" and [x["text"] for x in data["records"]] == ["before"]
            await keepalives(stream, 2)  # keep-alives while nothing comes
            _append(api, "other-job", ["not mine"])
            _append(api, job, ["after"])
            kind, data = await stream.next()
            assert kind == "records" and [x["text"] for x in data["records"]] == ["after"]
            assert stream.comments >= 2


async def test_a_follow_numbers_the_records_and_resumes_after_a_cursor(logs_api: Api) -> None:
    """Each record's number in its job, the event's id its last record's cursor;
    ``after`` or ``Last-Event-ID`` resumes right after it: nothing missing or twice."""
    api = logs_api
    owner = await api.signup()
    job = (await _create(api, owner))["id"]
    _append(api, job, ["one", "two"])
    _append(api, "other-job", ["not mine"])
    _append(api, job, ["three"])
    with trio.fail_after(30):
        async with served(api) as client:
            async with events(client, f"/jobs/{job}/logs?follow=1", owner) as stream:
                kind, data = await stream.next()
                assert [(r["seq"], r["text"]) for r in data["records"]] == [
                    (1, "one"), (2, "two"), (3, "three")]
                assert stream.last_id == f"{data['stream']}:3"
                first = f"{data['stream']}:1"
            for held, how in ((3, {"after": first}), (4, {"last-event-id": first})):
                query = f"&after={first}" if "after" in how else ""
                headers = {} if "after" in how else how
                async with events(client, f"/jobs/{job}/logs?follow=1{query}", owner,
                                  headers) as stream:
                    kind, data = await stream.next()
                    assert kind == "records"
                    assert [r["seq"] for r in data["records"]] == list(range(2, held + 1))
                    _append(api, job, [f"line {held + 1}"])
                    _, data = await stream.next()
                    assert [(r["seq"], r["text"]) for r in data["records"]] == [
                        (held + 1, f"line {held + 1}")]
            for bad in ("3", "x.1:1", "abc.1:1:1"):
                r = await client.get(f"/jobs/{job}/logs", params={"follow": "1", "after": bad},
                                     headers=bearer(owner))
                assert r.status_code == 422 and r.json()["error"]["field"] == "after", bad


async def test_a_stopped_wrk_monitor_ends_the_follow_then_is_503(logs_api: Api) -> None:
    api = logs_api
    owner = await api.signup()
    job = (await _create(api, owner))["id"]
    _append(api, job, ["before"])
    assert api.monitor_scope is not None
    with trio.fail_after(30):
        async with served(api) as client, \
                events(client, f"/jobs/{job}/logs?follow=1", owner) as stream:
            assert (await stream.next())[0] == "records"
            api.monitor_scope.cancel()
            kind, data = await stream.next()
            assert kind == "lagged" and data["id"] == job and data["message"]
            assert await stream.ended()
        for query in ("", "?follow=1"):
            r = await api.client.get(f"/api/jobs/{job}/logs{query}", headers=bearer(owner))
            assert r.status_code == 503
            error = r.json()["error"]
            assert error["code"] == "MONITOR_UNAVAILABLE" and "not reachable" in error["message"]


def test_the_schema_lists_the_route() -> None:
    paths = openapi()["paths"]
    assert "/api/jobs/{job}/logs" in paths
    assert _events.KEEPALIVE_S == _logs.KEEPALIVE_S
