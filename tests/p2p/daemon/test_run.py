"""A daemon on the kit as a real process: settings, logs, one metrics endpoint, lock, signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import trio

from ..helpers import http_get

EXAMPLE = [sys.executable, "-m", "tests.p2p.daemon.example_daemon"]


async def read_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while b"\n" not in data:
        chunk = await stream.receive_some()
        assert chunk, f"the process exited after printing {data!r}"
        data += chunk
    return data.decode().split("\n", 1)[0]


async def open_example(*args, env=None):
    return await trio.lowlevel.open_process(
        [*EXAMPLE, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, **(env or {})),
    )


async def finish(process) -> tuple[int, str]:
    with trio.fail_after(30):
        code = await process.wait()
    stderr = b""
    while chunk := await process.stderr.receive_some():
        stderr += chunk
    return code, stderr.decode()


async def test_serves_one_endpoint_and_stops_cleanly_on_sigint(tmp_path):
    """Settings from a file and the environment; SIGINT (Ctrl-C) stops it cleanly.
    SIGTERM: the next test's daemon, which costs no process of its own."""
    signum = signal.SIGINT
    config = tmp_path / "example.toml"
    config.write_text(
        f'storage = "{tmp_path / "store"}"\nport = 11\n[metrics]\nhost = "127.0.0.1"\n'
    )
    process = await open_example(
        "--config",
        str(config),
        env={
            "COSMICAC_EXAMPLE__METRICS__PORT": "0",
            "COSMICAC_EXAMPLE__PORT": "12",
            "COSMICAC_EXAMPLE__RELAYS": json.dumps(["ab" * 32]),
            "COSMICAC_EXAMPLE__LOG_LEVEL": "info",
        },
    )
    try:
        with trio.fail_after(30):
            line = await read_line(process.stdout)
        # metrics.port 0 is "off" in the file; the env beat the file for port
        assert line == "ready 0 12 1"
    finally:
        process.send_signal(signum)
    code, stderr = await finish(process)
    assert code == 0, stderr
    records = [json.loads(line) for line in stderr.splitlines()]  # JSON lines: not a TTY
    messages = [record["message"] for record in records]
    assert f"example.stopped signal={signal.Signals(signum).name}" in messages


async def test_a_running_daemon_serves_metrics_keeps_its_storage_and_stops_on_sigterm(
    tmp_path,
):
    """One running daemon for three neighbouring facts (a process each cost three
    times the CPU): its metrics endpoint shows what components added, a second
    daemon on the same storage is refused with one line naming the first, and
    SIGTERM stops it cleanly (SIGINT: the test above)."""
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = await open_example(
        env={
            "COSMICAC_EXAMPLE__METRICS__PORT": str(port),
            "COSMICAC_EXAMPLE__STORAGE": str(tmp_path),
            "COSMICAC_EXAMPLE__LOG_LEVEL": "info",
        }
    )
    try:
        with trio.fail_after(30):
            assert await read_line(first.stdout) == f"ready {port} 4000 0"
            status, body = await http_get(("127.0.0.1", port), "/metrics")
        assert status == 200 and b"example_starts_total 1.0" in body
        second = await open_example(env={"COSMICAC_EXAMPLE__STORAGE": str(tmp_path)})
        code, stderr = await finish(second)
        assert code == 1
        assert stderr == (
            f"error: storage folder {tmp_path.resolve()} is in use by process "
            f"{first.pid}; give each daemon its own --storage\n"
        )
    finally:
        first.send_signal(signal.SIGTERM)
    code, stderr = await finish(first)
    assert code == 0, stderr
    messages = [json.loads(line)["message"] for line in stderr.splitlines()]
    assert "example.stopped signal=SIGTERM" in messages


async def test_a_busy_metrics_port_is_one_line_and_exit_1(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        process = await open_example(env={"COSMICAC_EXAMPLE__METRICS__PORT": str(port)})
        code, stderr = await finish(process)
    assert code == 1
    assert stderr.strip().splitlines()[-1] == (
        f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("env", "code", "line"),
    [
        (
            {"COSMICAC_EXAMPLE__PORT": "99999"},
            2,
            "error: bad setting port (from COSMICAC_EXAMPLE__PORT): Input should be less than "
            "or equal to 65535, got '99999'",
        ),
        ({"COSMICAC_EXAMPLE__FAIL_WITH": "daemon-error"}, 1, "error: the example cannot start"),
        (
            {"COSMICAC_EXAMPLE__FAIL_WITH": "os-error"},
            1,
            "error: cannot listen: Address already in use",
        ),
    ],
)
async def test_failures_are_one_line_with_their_exit_code(env, code, line):
    process = await open_example(env=env)
    got, stderr = await finish(process)
    assert got == code
    assert stderr.strip().splitlines()[-1] == line
    assert "Traceback" not in stderr
