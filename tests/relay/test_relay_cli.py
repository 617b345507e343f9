"""`blind-relay` and `cosmicac relay` as real processes, and their argument checks."""

import re
import signal
import subprocess
import sys

import trio
from typer.testing import CliRunner

from cli.main import app
from p2p.connection import dial_tcp
from p2p.keys import load_or_create_keypair
from p2p.relay import accept_via_relay, dial_via_relay, keep_reservation

from ..cli.helpers import COSMICAC, read_until
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


async def start(command, storage):
    return await trio.lowlevel.open_process(
        [*command, "--storage", str(storage), "--port", "0", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


async def stop(process, signum=signal.SIGINT) -> int:
    process.send_signal(signum)
    with trio.fail_after(10):
        return await process.wait()


async def test_blind_relay_prints_storage_and_key_keeps_the_key_on_restart_and_exits_0_on_sigint(
    tmp_path,
):
    storage = tmp_path / "relay-storage"
    keys = []
    with trio.fail_after(60):
        for _ in range(2):
            process = await start(BLIND_RELAY, storage)
            try:
                lines = await read_lines(process.stdout, 2)
                assert lines[0] == f"Using storage at {storage.resolve()}"
                match = re.fullmatch(r"Server listening on ([0-9a-f]{64})", lines[1])
                assert match, lines
                keys.append(match[1])
                started = trio.current_time()
                assert await stop(process) == 0
                assert trio.current_time() - started < 5
                assert await process.stdout.receive_some() == b""  # nothing more on stdout
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    assert keys[0] == keys[1] == load_or_create_keypair(storage).hex


async def test_cosmicac_relay_relays_a_connection_between_two_peers_and_stops_on_sigterm(
    tmp_path,
):
    process = await start([*COSMICAC, "relay"], tmp_path / "relay")
    try:
        with trio.fail_after(30):
            lines = await read_lines(process.stdout, 2)
            relay_key = bytes.fromhex(lines[1].removeprefix("Server listening on "))
            match = await read_until(process.stderr, STARTED)  # a JSON log line
            assert match[1] == relay_key.hex()
            address = (match[2], int(match[3]))
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
