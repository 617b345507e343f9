"""`blind-relay` and `cosmicac relay` as real processes, and their argument checks."""

import json
import os
import re
import signal
import subprocess
import sys

import trio
from typer.testing import CliRunner

from cli.main import app
from nodes.kit.ready import parse_ready
from p2p.connection import dial_tcp
from p2p.keys import load_or_create_keypair
from p2p.relay import accept_via_relay, dial_via_relay, keep_reservation

from ..cli.helpers import COSMICAC, read_until
from ..cli.support import cosmicac, invoke
from ..p2p.helpers import ALICE, BOB

BLIND_RELAY = [sys.executable, "-m", "cli.relay"]
STARTED = re.compile(r'"relay\.started key=([0-9a-f]{64}) tcp=([0-9.]+):(\d+)')


async def read_lines(stream: trio.abc.ReceiveStream, count: int) -> list[str]:
    data = b""
    while data.count(b"\n") < count:
        chunk = await stream.receive_some()
        assert chunk, f"the process exited after printing {data!r}"
        data += chunk
    return data.decode().splitlines()


async def start(command, storage, *extra, env=None):
    storage_args = ["--storage", str(storage)] if storage is not None else []
    return await trio.lowlevel.open_process(
        [*command, *storage_args, "--port", "0", "--host", "127.0.0.1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(os.environ, **(env or {})),
    )


async def finish(process) -> tuple[int, str]:
    with trio.fail_after(30):
        code = await process.wait()
    stderr = b""
    while chunk := await process.stderr.receive_some():
        stderr += chunk
    return code, stderr.decode()


async def stop(process, signum=signal.SIGINT) -> int:
    process.send_signal(signum)
    with trio.fail_after(10):
        return await process.wait()


async def test_cosmicac_relay_relays_a_connection_between_two_peers_and_stops_on_sigterm(
    tmp_path,
):
    process = await start([*COSMICAC, "relay"], tmp_path / "relay")
    try:
        with trio.fail_after(30):
            lines = await read_lines(process.stdout, 3)
            relay_key = bytes.fromhex(lines[1].removeprefix("Server listening on "))
            ready = parse_ready(lines[2])  # cosmicac relay adds the daemons' ready line
            match = await read_until(process.stderr, STARTED)  # a JSON log line
            assert ready is not None and match[1] == relay_key.hex() == ready.key
            address = ready.address("tcp")
            assert address == (match[2], int(match[3]))
            async with trio.open_nursery() as peers:
                target = await dial_tcp(*address, BOB, relay_key)
                await peers.start(target.run)
                accepted = trio.Event()
                box = {}

                async def on_incoming(incoming):
                    box["connection"] = await accept_via_relay(address, incoming, BOB)
                    accepted.set()

                await peers.start(keep_reservation, target, on_incoming)
                dialer = await dial_tcp(*address, ALICE, relay_key)
                await peers.start(dialer.run)
                dialed = await dial_via_relay(dialer, address, ALICE, BOB.public_key)
                await accepted.wait()
                message = b"through a relay in another process"
                await dialed.stream.send_all(message)
                assert await box["connection"].stream.receive_some() == message
                await dialed.stream.aclose()
                await box["connection"].stream.aclose()
                peers.cancel_scope.cancel()
        assert await stop(process, signal.SIGTERM) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_a_bad_allow_key_or_bootstrap_exits_2_naming_it():
    runner = CliRunner()
    result = runner.invoke(app, ["relay", "--allow", "not-a-key"])
    assert result.exit_code == 2
    assert "--allow key" in result.output
    result = runner.invoke(app, ["relay", "--bootstrap", "nowhere"])
    assert result.exit_code == 2
    assert "bad bootstrap address" in result.output


async def test_a_config_file_is_used_a_second_relay_is_refused_and_a_restart_keeps_the_key(
        tmp_path):
    """blind-relay prints its storage and key. One relay from a config file: its storage
    and metrics endpoint are the file's, the host the environment's, the log level the
    option's; relay and DHT metrics share the one endpoint. A second relay on its
    storage is refused while it runs; SIGTERM stops it. Restarted on that storage (by
    --storage), it keeps its key, and SIGINT stops it at once, exit 0."""
    import socket

    from ..p2p.helpers import http_get

    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    storage = tmp_path / "from-file"
    config = tmp_path / "relay.toml"
    config.write_text(f'storage = "{storage}"\nhost = "127.0.0.2"\nport = 0\n'
                      'log_level = "warning"\n'
                      f"[metrics]\nhost = '127.0.0.1'\nport = {port}\n")
    process = await trio.lowlevel.open_process(
        [*BLIND_RELAY, "--config", str(config), "--log-level", "info"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(os.environ, COSMICAC_RELAY__HOST="127.0.0.1"))
    try:
        with trio.fail_after(30):
            lines = await read_lines(process.stdout, 2)
            match = await read_until(process.stderr, STARTED)  # --log-level beat the file
            status, body = await http_get(("127.0.0.1", port), "/metrics")
        assert lines[0] == f"Using storage at {storage.resolve()}"  # from the file
        key = re.fullmatch(r"Server listening on ([0-9a-f]{64})", lines[1])
        assert key, lines
        assert match[2] == "127.0.0.1"  # the environment's host, not the file's
        assert status == 200
        assert b"relay_reservations" in body and b"dht_requests_served" in body
        # A second relay on that storage, in this process: refused at its storage lock,
        # before it listens.
        with trio.fail_after(30):
            second = await cosmicac("relay", "--storage", str(storage), "--port", "0",
                                    "--host", "127.0.0.1")
        assert second.returncode == 1
        assert second.stderr.decode().strip() == (
            f"error: storage folder {storage.resolve()} is in use by process {process.pid}; "
            "give each daemon its own --storage")
    finally:
        assert await stop(process, signal.SIGTERM) == 0
    _, stderr = await finish(process)
    assert "relay.stopped signal=SIGTERM" in stderr

    restarted = await start(BLIND_RELAY, storage)
    try:
        with trio.fail_after(30):
            lines = await read_lines(restarted.stdout, 2)
        assert lines == [f"Using storage at {storage.resolve()}",
                         f"Server listening on {key[1]}"]  # the same key
        started = trio.current_time()
        assert await stop(restarted) == 0
        assert trio.current_time() - started < 5
        assert await restarted.stdout.receive_some() == b""  # nothing more on stdout
    finally:
        if restarted.returncode is None:
            restarted.kill()
            await restarted.wait()
    assert key[1] == load_or_create_keypair(storage).hex


def test_the_settings_reach_the_server(tmp_path):
    # Through CliRunner-free plumbing: the file, env and options build one RelayConfig.
    from p2p.daemon import load_settings
    from relay import RelaySettings

    config = tmp_path / "relay.json"
    config.write_text(json.dumps({"max_pairs": 7, "idle_timeout_s": 30.0,
                                  "allow": ["ab" * 32], "metrics": {"port": 9}}))
    settings = load_settings(RelaySettings, config_file=config, environ={
        "COSMICAC_RELAY__MAX_PAIRS": "9", "COSMICAC_RELAY_PAIR_TIMEOUT": "3"},
        overrides={"metrics.port": 10})
    relay_config = settings.relay_config()
    assert relay_config.max_pairs == relay_config.max_pending_pairs == 9
    assert relay_config.idle_timeout_s == 30.0 and relay_config.pair_timeout_s == 3.0
    assert relay_config.allow == frozenset({bytes.fromhex("ab" * 32)})
    assert settings.metrics.port == 10


def test_a_bad_environment_value_names_its_key_and_exits_2(tmp_path):
    # In this process: blind-relay is the same `relay` command (cli.relay.main), and the
    # settings are refused before anything starts; its process runs in the tests above.
    args = ["relay", "--storage", str(tmp_path), "--port", "0", "--host", "127.0.0.1"]
    result = invoke(args, env=dict(os.environ, COSMICAC_RELAY__ALLOW='["not-a-key"]'))
    assert result.returncode == 2
    assert result.stderr.decode().strip() == (
        "error: bad setting allow[0] (from COSMICAC_RELAY__ALLOW): a public key is 64 hex "
        "characters, got 9: 'not-a-key'")
    result = invoke(args, env=dict(os.environ, COSMICAC_RELAY__METRICS__PORT="http"))
    assert result.returncode == 2
    assert result.stderr.decode().startswith(
        "error: bad setting metrics.port (from COSMICAC_RELAY__METRICS__PORT): ")


def test_options_out_of_range_are_usage_errors():
    runner = CliRunner()
    for args in (["--port", "70000"], ["--port", "-1"], ["--max-pairs", "0"],
                 ["--pair-timeout", "0"], ["--idle-timeout", "nan"],
                 ["--metrics-port", "65536"]):
        result = runner.invoke(app, ["relay", *args])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
