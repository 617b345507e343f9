"""`cosmicac dht`: announce (a real process, the group's smoke test: Ctrl-C unannounces)
and lookup (run in this process) over DHT nodes run in this process as ``dht node`` runs
them; ``dht node`` itself as a real process serving its metrics."""

import json
import re
import signal
import subprocess
from contextlib import AsyncExitStack

import trio

from .helpers import process, read_ready, read_until
from .support import cosmicac, dht_node

#: The line for people on stderr (machines read the ready line on stdout).
LISTENING = re.compile(r"listening on (\S+):(\d+) node-id")


async def lookup(bootstrap, topic):
    result = await cosmicac("dht", "lookup", topic, "--bootstrap", bootstrap)
    records = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return result.returncode, records


async def test_announce_and_lookup_between_cli_nodes_then_unannounce_on_ctrl_c():
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)
            bootstrap = await dht_node(nursery)
            for _ in range(10):
                await dht_node(nursery, bootstrap)

            announcer = await stack.enter_async_context(process(
                "dht", "announce", "my-service", "--bootstrap", bootstrap,
                "--address", "127.0.0.1:7000", stdout=subprocess.PIPE,
            ))
            await read_until(announcer.stderr, re.compile(r"announced on (\d+) nodes"))
            key = (await announcer.stdout.receive_some()).decode().strip()
            assert len(key) == 64

            code, records = await lookup(bootstrap, "my-service")
            assert code == 0
            assert [r["public_key"] for r in records] == [key]
            assert records[0]["addresses"] == ["127.0.0.1:7000"]

            announcer.send_signal(signal.SIGINT)
            assert await announcer.wait() == 0
            code, records = await lookup(bootstrap, "my-service")
            assert (code, records) == (1, [])


async def test_lookup_of_an_unknown_topic_exits_1_and_bad_bootstrap_exits_2():
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            code, records = await lookup(await dht_node(nursery), "nobody-here")
            assert (code, records) == (1, [])
            nursery.cancel_scope.cancel()
    result = await cosmicac("dht", "lookup", "x", "--bootstrap", "not-an-address")
    assert result.returncode == 2
    assert "bad bootstrap address" in result.stderr.decode()


async def test_a_dht_node_serves_its_metrics():
    import socket

    from tests.p2p.helpers import http_get

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)
            node = await stack.enter_async_context(process(
                "dht", "node", "--bootstrap", await dht_node(nursery),
                "--metrics-port", str(metrics_port), stdout=subprocess.PIPE,
            ))
            await read_ready(node.stdout, "dht-node")
            status, body = await http_get(("127.0.0.1", metrics_port), "/metrics")
            assert status == 200
            text = body.decode()
            assert "dht_persistent 1.0" in text  # proved reachable by a probe
            assert "dht_reachable 1.0" in text
            assert re.search(r"^dht_contacts 1\.0$", text, re.MULTILINE)
            assert re.search(r'^dht_datagrams_total\{direction="sent"\} [1-9]', text,
                             re.MULTILINE)
