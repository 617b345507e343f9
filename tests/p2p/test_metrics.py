"""The metrics endpoint serves one component's registry over real HTTP."""

from prometheus_client import Counter

from p2p.metrics import CollectorRegistry, serve_metrics

from .helpers import http_get


async def test_serves_its_own_registry_only(nursery):
    mine, other = CollectorRegistry(), CollectorRegistry()
    Counter("relay_pairs", "pairs made", registry=mine).inc(3)
    Counter("unrelated_things", "not ours", registry=other).inc()
    address = await nursery.start(serve_metrics, mine)
    status, body = await http_get(address, "/metrics")
    assert status == 200
    assert b"relay_pairs_total 3.0" in body
    assert b"unrelated_things" not in body


async def test_two_endpoints_bind_distinct_free_ports(nursery):
    first = await nursery.start(serve_metrics, CollectorRegistry())
    second = await nursery.start(serve_metrics, CollectorRegistry())
    assert first[1] != second[1] and first[1] > 0
