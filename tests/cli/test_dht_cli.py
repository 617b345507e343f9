"""`cosmicac dht` as real processes: a bootstrap, plain nodes, announce and lookup."""

import json
import re
import signal
import subprocess
from contextlib import AsyncExitStack

import trio

from .helpers import COSMICAC, process, read_ready, read_until

#: The line for people on stderr (machines read the ready line on stdout).
LISTENING = re.compile(r"listening on (\S+):(\d+) node-id")


async def lookup(bootstrap, topic):
    result = await trio.run_process(
        [*COSMICAC, "dht", "lookup", topic, "--bootstrap", bootstrap],
        capture_stdout=True, capture_stderr=True, check=False,
    )
    records = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return result.returncode, records


async def test_announce_and_lookup_between_cli_nodes_then_unannounce_on_ctrl_c():
    with trio.fail_after(120):
        async with AsyncExitStack() as stack:
            boot = await stack.enter_async_context(process(
                "dht", "bootstrap", "--port", "0", stdout=subprocess.PIPE))
            bootstrap = (await read_ready(boot.stdout, "dht-bootstrap")).fields["udp"]
            nodes = []
            for _ in range(10):
                nodes.append(await stack.enter_async_context(
                    process("dht", "node", "--bootstrap", bootstrap, stdout=subprocess.PIPE)
                ))
            for node in nodes:
                await read_ready(node.stdout, "dht-node")

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
        async with process("dht", "bootstrap", "--port", "0", stdout=subprocess.PIPE) as boot:
            ready = await read_ready(boot.stdout, "dht-bootstrap")
            people = await read_until(boot.stderr, LISTENING)  # their line stays on stderr
            assert f"{people[1]}:{people[2]}" == ready.fields["udp"]
            code, records = await lookup(ready.fields["udp"], "nobody-here")
            assert (code, records) == (1, [])
    result = await trio.run_process(
        [*COSMICAC, "dht", "lookup", "x", "--bootstrap", "not-an-address"],
        capture_stdout=True, capture_stderr=True, check=False,
    )
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
            boot = await stack.enter_async_context(process(
                "dht", "bootstrap", "--port", "0", stdout=subprocess.PIPE))
            ready = await read_ready(boot.stdout, "dht-bootstrap")
            node = await stack.enter_async_context(process(
                "dht", "node", "--bootstrap", ready.fields["udp"],
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
