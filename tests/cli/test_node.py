"""`cosmicac up` as a real process: reachable by `cosmicac ping`, stops cleanly."""

import json
import re
import signal
import subprocess

import trio

from .helpers import COSMICAC, read_until

LISTENING = re.compile(r"node listening on (\S+):(\d+) key ([0-9a-f]{64})")


async def test_up_serves_ping_and_stops_cleanly_on_sigint(tmp_path):
    with trio.fail_after(60):
        node = await trio.lowlevel.open_process(
            [*COSMICAC, "up", "--storage", str(tmp_path), "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            match = await read_until(node.stderr, LISTENING)
            address, key = f"{match[1]}:{match[2]}", match[3]
            result = await trio.run_process(
                [*COSMICAC, "ping", key, "--address", address, "-c", "3", "-i", "0", "-o", "json"],
                capture_stdout=True, capture_stderr=True, check=False,
            )
            assert result.returncode == 0, result.stderr.decode()
            report = json.loads(result.stdout)
            assert report["peer"] == key
            assert report["received"] == report["sent"] == 3
            assert report["min_ms"] <= report["avg_ms"] <= report["max_ms"]

            node.send_signal(signal.SIGINT)
            logs = b""
            while chunk := await node.stdout.receive_some():
                logs += chunk
            assert await node.wait() == 0
        finally:
            if node.returncode is None:
                node.kill()
    events = [json.loads(line)["message"].split()[0] for line in logs.decode().splitlines()]
    assert events[-2:] == ["node.stopping", "node.stopped"]


async def test_ping_to_a_wrong_key_names_both_keys(tmp_path):
    with trio.fail_after(60):
        node = await trio.lowlevel.open_process(
            [*COSMICAC, "up", "--storage", str(tmp_path), "--port", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            match = await read_until(node.stderr, LISTENING)
            wrong = "cd" * 32
            result = await trio.run_process(
                [*COSMICAC, "ping", wrong, "--address", f"{match[1]}:{match[2]}"],
                capture_stdout=True, capture_stderr=True, check=False,
            )
        finally:
            node.kill()
            await node.wait()
    assert result.returncode == 1
    message = result.stderr.decode()
    assert wrong in message and match[3] in message
