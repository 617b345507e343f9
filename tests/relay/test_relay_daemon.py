"""run_relay on 127.0.0.1: found by key through the DHT, same port for TCP and UDP, metrics."""

import functools
import re

import trio

from p2p.dht import DhtNode, UdpTransport
from p2p.keys import KeyPair
from p2p.relay import RefusalCode, RelayRefused, Role, attach, request_pair
from relay import run_relay

from ..p2p.helpers import ALICE, BOB
from ..p2p.test_metrics import http_get
from .helpers import RELAY as RELAY_KEY
from .helpers import control, reserve


async def find_relay(node: DhtNode, key: bytes):
    with trio.fail_after(15):
        # The announcer starts after run_relay reports started: look until it lands.
        while (record := await node.find_peer(key)) is None:  # noqa: ASYNC110
            await trio.sleep(0.05)
    return record


async def test_the_relay_announces_its_tcp_address_under_its_key_on_the_dht(nursery):
    boot = DhtNode(await UdpTransport.bind("127.0.0.1"), persistent=True, reachable=True)
    await nursery.start(boot.run)
    client = DhtNode(await UdpTransport.bind("127.0.0.1"), bootstrap=[boot.address])
    await nursery.start(client.run)
    with trio.fail_after(20):
        async with trio.open_nursery() as relay_nursery:
            started = await relay_nursery.start(functools.partial(
                run_relay, RELAY_KEY, host="127.0.0.1", port=0, bootstrap=[boot.address],
            ))
            assert started.tcp[1] == started.dht[1]  # one port number for TCP and UDP
            assert started.metrics is None
            record = await find_relay(client, RELAY_KEY.public_key)
            assert list(record.addresses) == [started.tcp]
            # What the record names is the relay: a control connection reaches its key.
            connection = await control(nursery, record.addresses[0], RELAY_KEY)
            await connection.aclose()
            # Stop the relay while the DHT still runs, so it can unannounce.
            relay_nursery.cancel_scope.cancel()


async def test_the_metrics_endpoint_counts_reservations_pairs_bytes_and_refusals(nursery):
    started = await nursery.start(functools.partial(
        run_relay, RELAY_KEY, host="127.0.0.1", port=0, metrics_port=0,
    ))
    address = started.tcp
    with trio.fail_after(20):
        incoming = await reserve(nursery, await control(nursery, address, BOB))
        dialer = await control(nursery, address, ALICE)
        try:
            await request_pair(dialer, KeyPair.from_seed(b"\x01" * 32).public_key)
        except RelayRefused as exc:
            assert exc.code == RefusalCode.NOT_RESERVED
        # One full pair that moves a few bytes.
        ticket = await request_pair(dialer, BOB.public_key)
        item = await incoming.receive()
        streams = {}

        async def responder():
            streams["r"] = await attach(address, item.token, role=Role.RESPONDER)

        async with trio.open_nursery() as both:
            both.start_soon(responder)
            streams["i"] = await attach(address, ticket.token, role=Role.INITIATOR)
        await streams["i"].send_all(b"x" * 1000)
        received = 0
        while received < 1000:
            received += len(await streams["r"].receive_some())
        status, body = await http_get(started.metrics, "/metrics")
    assert status == 200
    text = body.decode()

    def value(name: str) -> float:
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        assert match, f"{name} missing from:\n{text}"
        return float(match[1])

    assert value("blind_relay_reservations") == 1
    assert value("blind_relay_active_pairs") == 1
    assert value("blind_relay_pending_pairs") == 0
    assert value("blind_relay_pairs_total") == 1
    assert value("blind_relay_relayed_bytes_total") == 1000
    assert value('blind_relay_refusals_total{reason="NOT_RESERVED"}') == 1
    assert value('blind_relay_refusals_total{reason="NOT_ALLOWED"}') == 0
    assert "# TYPE blind_relay_pairs_total counter" in text
    await streams["i"].aclose()
    await streams["r"].aclose()


async def test_cancelling_the_relay_while_it_bootstraps_returns_promptly():
    # Regression: the DHT node was shielded (to outlive the announcer's
    # unannounce) from its start, so a cancel during bootstrap left it running
    # forever and run_relay never returned.
    silent = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
    await silent.bind(("127.0.0.1", 0))  # takes datagrams, never answers
    with silent, trio.fail_after(10):
        with trio.move_on_after(0.3) as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(
                    run_relay, RELAY_KEY, host="127.0.0.1", port=0,
                    bootstrap=[silent.getsockname()],
                ))
        assert scope.cancelled_caught


async def test_the_relay_hands_its_and_its_dht_nodes_metrics_to_the_process_endpoint(nursery):
    from prometheus_client import generate_latest

    from p2p.metrics import ProcessMetrics

    started = await nursery.start(functools.partial(
        run_relay, RELAY_KEY, host="127.0.0.1", port=0))  # no endpoint of its own
    assert started.metrics is None
    process = ProcessMetrics()
    process.add(started.registry)
    text = generate_latest(process.registry).decode()
    assert "blind_relay_reservations" in text
    assert "dht_requests_served" in text
