"""The kit's peer shell: start_peer and serve_http, on MemoryInternet and on loopback."""

from __future__ import annotations

import functools
import socket

import httpx
import pytest
import trio
from pydantic_settings import SettingsConfigDict

from nodes.kit.peer import HttpBindError, in_process, serve_http, start_peer
from nodes.kit.settings import HttpSettings, PeerSettings
from p2p.daemon import DaemonError, ProcessMetrics
from p2p.host import ChannelService
from p2p.keys import KeyPair
from p2p.net import MemoryInternet


class ExampleSettings(PeerSettings):
    model_config = SettingsConfigDict(env_prefix="COSMICAC_EXAMPLE__")

    port: int = 4100


async def echo(channel, connection):
    async for message in channel:
        await channel.send(message + b" from " + connection.remote_public_key.hex().encode())


async def test_a_started_peer_serves_its_services_on_the_daemons_network(tmp_path, nursery,
                                                                          autojump_clock):
    internet = MemoryInternet()
    await nursery.start(internet.run)
    metrics = ProcessMetrics()
    server_keys, client_keys = KeyPair.generate(), KeyPair.generate()
    settings = ExampleSettings(storage=tmp_path, host="10.0.0.1")
    with trio.fail_after(60):
        peer = await start_peer(
            in_process(nursery, metrics, internet.host("10.0.0.1")), server_keys, settings,
            [ChannelService("echo/1", echo)], reserved=lambda key: key == client_keys.public_key,
            stranger_evict_after_s=2.0)
        assert peer.address == ("10.0.0.1", 4100)
        assert peer.swarm.config.stranger_evict_after_s == 2.0  # passed through
        assert peer.swarm.host.is_reserved(client_keys.public_key)
        assert not peer.swarm.host.is_reserved(KeyPair.generate().public_key)
        # Its registry is on the process's endpoint.
        names = {metric.name for metric in metrics.registry.collect()}
        assert any(name.startswith("swarm_") for name in names), names

        client = await start_peer(in_process(nursery, None, internet.host("10.0.0.2")),
                                  client_keys, ExampleSettings(storage=tmp_path, port=0,
                                                               host="10.0.0.2"))
        connection = await client.swarm.connect(server_keys.public_key,
                                                addresses=[peer.address])
        channel = await connection.open_channel("echo/1")
        await channel.send(b"hello")
        answer = await channel.receive()
    assert answer == b"hello from " + client_keys.hex.encode()


async def test_setup_is_called_once_with_the_swarm_its_services_added(tmp_path, nursery,
                                                                     autojump_clock):
    internet = MemoryInternet()
    await nursery.start(internet.run)
    seen = []

    def setup(swarm) -> None:
        seen.append((swarm, swarm.statistics().services))

    with trio.fail_after(60):
        peer = await start_peer(in_process(nursery, None, internet.host("10.0.0.1")),
                                KeyPair.generate(), ExampleSettings(storage=tmp_path),
                                [ChannelService("echo/1", echo)], setup=setup)
    # Called once, with the swarm it returns, its services already added.
    assert seen == [(peer.swarm, ("echo/1",))]


async def test_a_busy_swarm_port_is_one_daemon_error_naming_it(tmp_path, nursery):
    with socket.socket() as busy, trio.fail_after(30):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = ExampleSettings(storage=tmp_path, host="127.0.0.1", port=port)
        with pytest.raises(DaemonError) as caught:
            await start_peer(in_process(nursery), KeyPair.generate(), settings)
    assert str(caught.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use"
    assert caught.value.exit_code == 1


async def hello_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.mark.parametrize("lean", [False, True])
async def test_serve_http_serves_on_its_settings_and_reports_the_bound_address(nursery, lean):
    with trio.fail_after(30):
        address = await nursery.start(functools.partial(
            serve_http, hello_app, HttpSettings(host="127.0.0.1", port=0), lean=lean))
        async with httpx.AsyncClient(trust_env=False) as http:
            answer = await http.get(f"http://127.0.0.1:{address[1]}/")
    assert address[0] == "127.0.0.1" and address[1] > 0
    assert answer.text == "hello"
    # hypercorn names itself; the lean server (p2p.httpserver) sends no server header
    assert ("server" in answer.headers) is not lean


@pytest.mark.parametrize("lean", [False, True])
async def test_a_busy_http_port_names_what_is_served_there(nursery, lean):
    with socket.socket() as busy, trio.fail_after(30):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(HttpBindError) as caught:
            await nursery.start(functools.partial(
                serve_http, hello_app, HttpSettings(host="127.0.0.1", port=port), "the API",
                lean=lean))
    assert str(caught.value) == f"cannot serve the API on 127.0.0.1:{port}: Address already in use"
    assert isinstance(caught.value, OSError)


async def test_start_served_runs_a_serve_function_with_the_daemons_storage_metrics_network(
        tmp_path, nursery):
    from nodes.kit.peer import start_served
    from p2p.daemon import Daemon

    locked = tmp_path / "locked"
    metrics, network = ProcessMetrics(), MemoryInternet().host("10.0.0.1")
    seen = {}

    async def serve_example(settings, *, metrics, network, extra, task_status):
        seen.update(storage=settings.storage, metrics=metrics, network=network, extra=extra)
        task_status.started("running")
        await trio.sleep_forever()

    daemon = Daemon("example", ExampleSettings(storage=tmp_path / "given"), nursery, metrics,
                    locked, network=network)
    with trio.fail_after(30):
        running = await start_served(daemon, serve_example, extra=1)
    assert running == "running"
    assert seen == {"storage": locked, "metrics": metrics, "network": network, "extra": 1}
    assert daemon.settings.storage == tmp_path / "given"  # a copy was changed, not its own
