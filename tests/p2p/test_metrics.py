"""The metrics endpoint: one per process over real HTTP, hypercorn loaded only to serve."""

import errno
import functools
import subprocess
import sys

import pytest
from prometheus_client import Counter

from p2p.metrics import CollectorRegistry, MetricsBindError, ProcessMetrics, serve_metrics

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


async def test_a_busy_port_is_one_plain_os_error_naming_the_address(nursery):
    first = await nursery.start(serve_metrics, CollectorRegistry())
    with pytest.raises(MetricsBindError) as info:
        await nursery.start(functools.partial(serve_metrics, CollectorRegistry(),
                                              host=first[0], port=first[1]))
    assert isinstance(info.value, OSError)
    assert info.value.errno == errno.EADDRINUSE
    assert str(info.value).startswith(f"cannot serve metrics on {first[0]}:{first[1]}: ")
    assert "\n" not in str(info.value)


async def test_process_metrics_shows_registries_added_while_it_is_served(nursery):
    first, second = CollectorRegistry(), CollectorRegistry()
    Counter("first_things", "one", registry=first).inc()
    Counter("second_things", "two", registry=second).inc(2)
    metrics = ProcessMetrics(first)
    address = await nursery.start(serve_metrics, metrics.registry)
    _, body = await http_get(address, "/metrics")
    assert b"first_things_total 1.0" in body and b"second_things" not in body
    metrics.add(second)
    metrics.add(second)  # once only
    _, body = await http_get(address, "/metrics")
    assert body.count(b"second_things_total 2.0") == 1
    metrics.remove(first)
    _, body = await http_get(address, "/metrics")
    assert b"first_things" not in body


HIDE_HYPERCORN = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "hypercorn" or name.startswith("hypercorn."):
            raise ImportError(f"{name} is hidden by the test")
        return None
sys.meta_path.insert(0, Hide())
for name in list(sys.modules):
    if name.startswith("hypercorn"):
        del sys.modules[name]
import p2p, p2p.metrics, p2p.swarm, p2p.dht, p2p.host, p2p.net, p2p.daemon, crdt
from crdt import Entry
assert not any(name.startswith("hypercorn") for name in sys.modules), "hypercorn was imported"
try:
    import hypercorn
except ImportError:
    pass
else:
    raise SystemExit("the finder did not hide hypercorn")
print("ok")
"""


def test_the_stack_imports_without_hypercorn():
    result = subprocess.run([sys.executable, "-c", HIDE_HYPERCORN], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
