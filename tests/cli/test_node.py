"""`cosmicac up` as a real process: reachable by `cosmicac ping` (run in this process),
stops cleanly."""

import json
import re
import signal
import socket
import subprocess
from contextlib import asynccontextmanager

import trio

from .helpers import COSMICAC, read_until
from .support import cosmicac, cosmicac_process

LISTENING = re.compile(r"node listening on (\S+):(\d+) key ([0-9a-f]{64})")


@asynccontextmanager
async def running_node(*options, env=None):
    """Start `cosmicac up` with ``options``; yield (process, "host:port", key); kill it if
    still running."""
    node = await trio.lowlevel.open_process(
        [*COSMICAC, "up", *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    try:
        with trio.fail_after(30):
            match = await read_until(node.stderr, LISTENING)
        yield node, f"{match[1]}:{match[2]}", match[3]
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()


async def ping(*args, process: bool = False):
    """``cosmicac ping *args``: in this process, or as a real one with ``process``."""
    return await (cosmicac_process if process else cosmicac)("ping", *args)


async def test_up_serves_ping_metrics_and_the_shared_database_then_stops_cleanly_on_sigint(
        tmp_path):
    """One node for what a running ``up`` serves (a node costs its start): its settings
    from a config file, the environment beating it (the host), options beating both
    (the port); ping (its smoke test a real process) and its metrics, a ping to a wrong
    key refused naming both keys, the shared database with this node as its admin; then
    SIGINT stops it cleanly, the database closed."""
    import os

    from tests.p2p.helpers import http_get

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    storage = tmp_path / "node"
    config = tmp_path / "node.toml"
    config.write_text(f'storage = "{storage}"\nhost = "127.0.0.2"\nport = 1\n')
    with trio.fail_after(60):
        async with running_node(
                "--config", str(config), "--port", "0", "--metrics-port", str(metrics_port),
                env=dict(os.environ, COSMICAC_NODE__HOST="127.0.0.1")) as (node, address, key):
            assert address.startswith("127.0.0.1:")  # the environment's, not the file's
            assert not address.endswith(":1")  # the option's port 0, not the file's
            assert (storage / "identity").exists()  # the file's storage
            result = await ping(key, "--address", address, "-c", "3", "-i", "0", "-o", "json",
                                process=True)
            assert result.returncode == 0, result.stderr.decode()
            report = json.loads(result.stdout)
            assert report["peer"] == key
            assert report["received"] == report["sent"] == 3
            assert report["min_ms"] <= report["avg_ms"] <= report["max_ms"]
            status, body = await http_get(("127.0.0.1", metrics_port), "/metrics")
            text = body.decode()
            assert status == 200
            assert "node_diagnostic_sessions_total 1.0" in text  # that one ping
            assert f'key="{key}"' in text

            wrong = "cd" * 32
            result = await ping(wrong, "--address", address)
            assert result.returncode == 1
            assert wrong in result.stderr.decode() and key in result.stderr.decode()

            match = await read_until(node.stderr, re.compile(
                r"shared database ([0-9a-f]{64}) on \S+:\d+[\s\S]*"
                r"PROXY_AUTOBASE_KEY=([0-9a-f]{64}) cosmicac db serve --storage DIR "
                r"--bootstrap (\S+):(\d+)"))
            assert match[1] == match[2] == key  # the node created it
            # One peer, one swarm: the DHT bootstrap and the database share the
            # node's port (TCP for connections, UDP for the DHT).
            assert f"{match[3]}:{match[4]}" == address
            while True:  # the daemon writes its status file within a second; bounded above
                result = await cosmicac("db", "status", "--storage", str(storage), "-o",
                                        "json")
                assert result.returncode == 0, result.stderr.decode()
                db_status = json.loads(result.stdout)
                if db_status["daemon_pid"] is not None:
                    break
                await trio.sleep(0.2)
            assert db_status["bootstrap"] == db_status["me"] == key
            assert db_status["daemon_pid"] == node.pid
            assert [(w["key"], w["admin"]) for w in db_status["writers"]] == [(key, True)]

            node.send_signal(signal.SIGINT)
            logs = b""
            while chunk := await node.stdout.receive_some():
                logs += chunk
            assert await node.wait() == 0
    events = [json.loads(line)["message"].split()[0] for line in logs.decode().splitlines()]
    assert events[-2:] == ["node.stopping", "node.stopped"]
    assert (storage / "db" / "gate.snapshot").exists()  # closed cleanly


def test_up_bad_settings_name_their_key_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["up", "--storage", str(tmp_path)],
                           env={"COSMICAC_NODE__PORT": "70000"})
    assert result.exit_code == 2
    assert result.output.strip() == ("error: bad setting port (from COSMICAC_NODE__PORT):"
                                     " Input should be less than or equal to 65535, got '70000'")
    result = runner.invoke(app, ["up", "--storage", str(tmp_path)],
                           env={"COSMICAC_PORT": "http"})  # the name from before the kit
    assert result.exit_code == 2
    assert result.output.startswith("error: bad setting port (from COSMICAC_PORT): ")
    result = runner.invoke(app, ["up", "--storage", str(tmp_path), "--db-reader", "nope"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: a --db-reader key is 64 hex characters, got 4: 'nope'"
    result = runner.invoke(app, ["up", "--storage", str(tmp_path)],
                           env={"COSMICAC_NODE__DB_READERS": "nope"})
    assert result.exit_code == 2
    assert result.output.startswith("error: bad setting db_readers[0] (from "
                                    "COSMICAC_NODE__DB_READERS): ")
