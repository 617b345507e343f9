"""Who may call what on wrk-monitor (least privilege).

RPC: every method the service serves, called from each kind of key (a log
pusher, a proxy, a worker, app-node, a stranger, no key): only the one
allow-list its row names is admitted, an empty list admits nobody, and a method
without a row cannot be added. HTTP: every route behind the bearer token (the
guard's table, sans-IO, over the routes the app really has), nothing served by
a wrk-monitor without a token, a request body never read, and the per-client
bound on follow streams keyed by the address a trusted proxy forwards.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from contracts.health import STATUS, StatusRequest
from contracts.monitor import (
    AGENTS_HEARD,
    FOLLOW,
    HEALTH_JOBS,
    METRICS_AGENTS,
    METRICS_PUSH,
    OBSERVABILITY_CLEAR,
    OBSERVABILITY_GET,
    OBSERVABILITY_SET,
    PUSH,
    QUERY,
    TAIL,
    AgentMetricsReport,
    Follow,
    HealthQuery,
    MetricsReport,
    Observability,
    ObservabilityClear,
    ObservabilityQuery,
    PushBatch,
    Query,
    Tail,
    encode_batch,
    make_record,
)
from nodes.kit.forwarded import TrustedProxies
from nodes.monitor._buffer import LogBuffer
from nodes.monitor._http import Guard, LogsFront, client_address, create_app
from nodes.monitor.agent_metrics import AgentMetricsBook, install
from nodes.monitor.service import MonitorService
from p2p.rpc import Method, RpcError

from .support import connect

DAEMON = b"\x01" * 32   # ships its logs: pushers
PROXY = b"\x02" * 32    # proxy-inference: proxies
WORKER = b"\x03" * 32   # a worker: workers
APP = b"\x04" * 32      # app-node: followers
STRANGER = b"\x05" * 32
CALLERS = {"daemon": DAEMON, "proxy": PROXY, "worker": WORKER, "app-node": APP,
           "stranger": STRANGER, "no key": None}

#: Who may call each method, written out (not read from METHOD_ROLES: this is the
#: contract the code must keep).
WHO = {
    "logs.push": {"daemon"},
    "metrics.push": {"proxy"},
    "metrics.agents": {"worker"},
    "logs.follow": {"app-node"},
    "logs.query": {"app-node"},
    "logs.tail": {"app-node"},
    "agents.heard": {"app-node"},
    "health.jobs": {"app-node"},
    "service.status": {"app-node"},
    "observability.set": {"app-node"},
    "observability.get": {"app-node"},
    "observability.clear": {"app-node"},
}
RECORD = make_record("hello", service="wrk-ork", job_id="j-1", time_ns=1)
PARAMS: dict[str, tuple[Any, Any]] = {
    "logs.push": (PUSH, PushBatch(records=encode_batch([RECORD]))),
    "metrics.push": (METRICS_PUSH, MetricsReport(window_s=60)),
    "metrics.agents": (METRICS_AGENTS, AgentMetricsReport()),
    "logs.follow": (FOLLOW, Follow()),
    "logs.query": (QUERY, Query()),
    "logs.tail": (TAIL, Tail(job_id="j-1")),
    "agents.heard": (AGENTS_HEARD, HealthQuery(job_ids=("j-1",))),
    "health.jobs": (HEALTH_JOBS, HealthQuery(job_ids=("j-1",))),
    "service.status": (STATUS, StatusRequest()),
    "observability.set": (OBSERVABILITY_SET, Observability()),
    "observability.get": (OBSERVABILITY_GET, ObservabilityQuery()),
    "observability.clear": (OBSERVABILITY_CLEAR, ObservabilityClear()),
}


def served(**lists: Any) -> MonitorService:
    """The service as the daemon builds it (agents' metrics installed)."""
    service = MonitorService(LogBuffer(), clock=trio.current_time, **lists)
    install(service, AgentMetricsBook())
    return service


def configured() -> MonitorService:
    return served(pushers=[DAEMON], proxies=[PROXY], workers=[WORKER], followers=[APP])


def served_methods(service: MonitorService) -> set[str]:
    return set(service.router._routes)


async def call(client, name: str) -> str | None:
    """Call ``name`` with valid params; the error code, or None when answered."""
    method, params = PARAMS[name]
    try:
        if isinstance(method, Method):
            await client.call(method, params)
        else:
            async with client.stream(method, params) as items:
                async for _ in items:  # the buffer's record: the stream is served
                    break
    except RpcError as exc:
        return exc.code
    return None


def test_every_method_served_has_a_row_and_the_table_has_no_extra_one():
    assert served_methods(configured()) == set(WHO) == set(PARAMS)


@pytest.mark.parametrize("caller", sorted(CALLERS))
async def test_each_method_admits_exactly_its_allow_list(nursery, autojump_clock, caller):
    service = configured()
    service.buffer.append([RECORD])  # a follow has something to send at once
    async with connect(nursery, service, CALLERS[caller]) as client:
        with trio.fail_after(30):
            for name in sorted(WHO):
                code = await call(client, name)
                if caller in WHO[name]:
                    # Admitted: answered, or refused for another reason (no
                    # observability holder here), never FORBIDDEN.
                    assert code in (None, "UNAVAILABLE"), (caller, name, code)
                else:
                    assert code == "FORBIDDEN", (caller, name, code)


async def test_a_key_with_the_proxys_role_cannot_read_logs_even_as_a_log_pusher(
        nursery, autojump_clock):
    # As `cosmicac up` configures it: the proxy ships its logs and pushes metrics.
    service = served(pushers=[DAEMON, PROXY], proxies=[PROXY], followers=[APP])
    service.buffer.append([RECORD])
    async with connect(nursery, service, PROXY) as proxy:
        with trio.fail_after(10):
            assert await call(proxy, "logs.push") is None
            assert await call(proxy, "metrics.push") is None
            for name in ("logs.follow", "logs.query", "health.jobs", "observability.set"):
                assert await call(proxy, name) == "FORBIDDEN", name
    assert service.buffer.followers == 0


async def test_empty_allow_lists_admit_nobody(nursery, autojump_clock):
    service = served()
    async with connect(nursery, service, DAEMON) as anyone:
        with trio.fail_after(10):
            for name in sorted(WHO):
                assert await call(anyone, name) == "FORBIDDEN", name


async def test_allow_any_pusher_opens_log_pushes_only(nursery, autojump_clock):
    service = served(allow_any_pusher=True)
    service.buffer.append([RECORD])
    async with connect(nursery, service, STRANGER) as stranger:
        with trio.fail_after(10):
            for name in sorted(WHO):
                code = await call(stranger, name)
                assert code == (None if name == "logs.push" else "FORBIDDEN"), name


async def test_a_refusal_names_the_setting_to_add_the_key_to(nursery, autojump_clock):
    async with connect(nursery, configured(), STRANGER) as stranger:
        with trio.fail_after(10), pytest.raises(RpcError) as refused:
            await stranger.call(METRICS_PUSH, MetricsReport(window_s=60))
    assert "wrk-monitor's proxies setting" in refused.value.message


def test_a_method_without_a_row_cannot_be_added():
    from pydantic import BaseModel

    class Nothing(BaseModel):
        pass

    async def handler(params, ctx):  # pragma: no cover - never added
        return params

    with pytest.raises(ValueError, match="METHOD_ROLES"):
        configured().add_method(Method("logs.delete", params=Nothing, result=Nothing), handler)


# -- HTTP ------------------------------------------------------------------------------

TOKEN = "s" * 32


def front(token: str | None = TOKEN, **kw: Any) -> LogsFront:
    return LogsFront(buffer=LogBuffer(), registry=CollectorRegistry(), token=token, **kw)


def scope(path: str, headers: dict[str, str] | None = None,
          client: tuple[str, int] = ("192.0.2.7", 40000)) -> dict:
    return {"type": "http", "method": "GET", "path": path, "client": client,
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}


def app_paths() -> list[str]:
    """Every route the app serves, with its parameters filled in."""
    app = create_app(front())
    assert isinstance(app, Guard)  # every route is behind the guard
    paths = [route.path for route in app.app.routes if isinstance(route, Route)]
    assert len(paths) == 6  # /metrics, logs, job metrics; each also under /monitor
    return [p.replace("{job_id}", "j-1") for p in paths]


#: (headers, the front's token) -> (status, code); None: served.
GUARD_TABLE = [
    ({}, TOKEN, (401, "UNAUTHORIZED")),
    ({"Authorization": f"Bearer {TOKEN}"}, TOKEN, None),
    ({"Authorization": f"bearer  {TOKEN}"}, TOKEN, None),
    ({"Authorization": f"Bearer {TOKEN}x"}, TOKEN, (401, "UNAUTHORIZED")),
    ({"Authorization": f"Bearer {TOKEN[:-1]}"}, TOKEN, (401, "UNAUTHORIZED")),
    ({"Authorization": f"Basic {TOKEN}"}, TOKEN, (401, "UNAUTHORIZED")),
    ({"Authorization": TOKEN}, TOKEN, (401, "UNAUTHORIZED")),
    ({"Authorization": "Bearer "}, TOKEN, (401, "UNAUTHORIZED")),
    ({}, None, (403, "HTTP_TOKEN_NOT_SET")),
    ({"Authorization": f"Bearer {TOKEN}"}, None, (403, "HTTP_TOKEN_NOT_SET")),
    ({"Authorization": f"Bearer {TOKEN}", "Content-Length": "5"}, TOKEN,
     (413, "BODY_NOT_ALLOWED")),
    ({"Authorization": f"Bearer {TOKEN}", "Transfer-Encoding": "chunked"}, TOKEN,
     (413, "BODY_NOT_ALLOWED")),
    ({"Authorization": f"Bearer {TOKEN}", "Content-Length": "0"}, TOKEN, None),
]


@pytest.mark.parametrize(("headers", "token", "expected"), GUARD_TABLE)
def test_every_route_is_guarded(headers, token, expected):
    import json

    guard = Guard(lambda *a: None, front(token))
    for path in app_paths():
        refusal = guard.refusal(scope(path, headers))
        if expected is None:
            assert refusal is None, path
            continue
        assert refusal is not None, path
        assert (refusal.status_code, json.loads(refusal.body)["error"]["code"]) == expected
        if expected[0] == 401:
            assert refusal.headers["www-authenticate"] == "Bearer"
        if expected[0] == 413:
            assert refusal.headers["connection"] == "close"


PROXY_NET = TrustedProxies(["10.0.0.0/24", "::1/128"])
NOBODY = TrustedProxies()


@pytest.mark.parametrize(("peer", "xff", "trusted", "client"), [
    ("192.0.2.7", None, NOBODY, "192.0.2.7"),
    ("192.0.2.7", "198.51.100.1", NOBODY, "192.0.2.7"),           # no trusted proxy: ignored
    ("192.0.2.7", "198.51.100.1", PROXY_NET, "192.0.2.7"),        # not from a trusted one
    ("10.0.0.5", "198.51.100.1", PROXY_NET, "198.51.100.1"),
    ("10.0.0.5", "203.0.113.9, 198.51.100.1", PROXY_NET, "198.51.100.1"),  # nearest untrusted
    ("10.0.0.5", "198.51.100.1, 10.0.0.6", PROXY_NET, "198.51.100.1"),     # proxies chained
    ("10.0.0.5", None, PROXY_NET, "10.0.0.5"),
    ("10.0.0.5", "10.0.0.6", PROXY_NET, "10.0.0.6"),
    ("10.0.0.5", "not-an-ip", PROXY_NET, "10.0.0.5"),  # the walk ends at what is no address
    ("::1", "2001:db8::0001", PROXY_NET, "2001:db8::1"),
])
def test_the_client_is_the_peer_unless_a_trusted_proxy_names_it(peer, xff, trusted, client):
    headers = {"X-Forwarded-For": xff} if xff is not None else {}
    assert client_address(scope("/metrics", headers, (peer, 1)), trusted) == client


def test_follow_slots_are_bounded_per_client_and_in_total():
    f = front(max_followers=5, max_followers_per_client=2)
    assert f.take_stream("a") is None and f.take_stream("a") is None
    refused = f.take_stream("a")
    assert refused is not None and "max_followers_per_client" in refused
    for client in ("b", "b", "c"):
        assert f.take_stream(client) is None
    refused = f.take_stream("d")  # room per client, none in total
    assert refused is not None and "http.max_followers" in refused
    f.release_stream("a")
    assert f.take_stream("d") is None
    for client in ("a", "b", "b", "c", "d"):
        f.release_stream(client)
    assert f.streams == 0 and f.client_streams == {}


@given(header=st.text(max_size=80))
def test_only_the_exact_token_as_a_bearer_passes(header):
    guard = Guard(lambda *a: None, front())
    try:
        header.encode("latin-1")
    except UnicodeEncodeError:
        return  # not a header value
    refusal = guard.refusal(scope("/metrics", {"Authorization": header}))
    scheme, _, given = header.encode("latin-1").partition(b" ")
    allowed = scheme.lower() == b"bearer" and given.strip() == TOKEN.encode()
    assert (refusal is None) == allowed
