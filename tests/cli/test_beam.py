"""`cosmicac beam` between two real processes over TCP on 127.0.0.1 (a beam pipes the
process's own file descriptors 0 and 1); a dialer that fails before it pipes anything
runs in this process (against a peer in this process when it needs one)."""

import hashlib
import os
import re
import socket
import subprocess

import trio

from p2p.keys import KeyPair
from p2p.swarm import Swarm, SwarmConfig

from .helpers import COSMICAC, read_until
from .support import cosmicac, invoke

BEAM = [*COSMICAC, "beam"]
LISTENING = re.compile(r"listening on (\S+):(\d+) key ([0-9a-f]{64})")


def open_fd(path, flags):
    return os.open(path, flags | os.O_CLOEXEC, 0o600)


async def start_listener(nursery, stdin_path, stdout_path):
    """Start `beam --listen` with files for stdin/stdout; return (process, address, key).

    The listener's stderr is a pipe read until its `listening on` line.
    """
    stdin = open_fd(stdin_path, os.O_RDONLY)
    stdout = open_fd(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        process = await trio.lowlevel.open_process(
            [*BEAM, "--listen", "--port", "0"],
            stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
        )
    finally:
        os.close(stdin)
        os.close(stdout)
    nursery.start_soon(_reap, process)
    with trio.fail_after(20):
        match = await read_until(process.stderr, LISTENING)
    return process, f"{match[1]}:{match[2]}", match[3]


async def _reap(process):
    try:
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()


async def test_beam_pipes_4_mib_each_way_between_two_processes(tmp_path):
    # 4 MiB: four times a mux channel's window (1 MiB) and 64 pipe buffers each way,
    # so both ends wait on flow control and on their pipes, many times, as 16 MiB did
    # (at a quarter of the Noise encryption's CPU).
    to_dialer = os.urandom(4 * 1024 * 1024)
    to_listener = os.urandom(4 * 1024 * 1024)
    (tmp_path / "listener.in").write_bytes(to_dialer)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            listener, address, key = await start_listener(
                nursery, tmp_path / "listener.in", tmp_path / "listener.out"
            )
            # The dialer uses pipes (the FdStream path); the listener regular files.
            dialer = await trio.run_process(
                [*BEAM, key, "--address", address],
                stdin=to_listener, capture_stdout=True, capture_stderr=True, check=False,
            )
            assert dialer.returncode == 0, dialer.stderr.decode()
            with trio.fail_after(20):
                await listener.wait()
    assert listener.returncode == 0
    assert hashlib.sha256(dialer.stdout).hexdigest() == hashlib.sha256(to_dialer).hexdigest()
    received = (tmp_path / "listener.out").read_bytes()
    assert hashlib.sha256(received).hexdigest() == hashlib.sha256(to_listener).hexdigest()


async def test_beam_to_the_wrong_key_exits_nonzero_naming_both_keys():
    # The peer that answers is a swarm in this process (any peer with another key
    # will do: the dialer fails at the handshake, before a listener would pipe);
    # `beam --listen` runs as a process in the tests that pipe through it.
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            peer = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", port=0))
            host, port = await nursery.start(peer.run)
            wrong = KeyPair.generate().hex
            dialer = await cosmicac("beam", wrong, "--address", f"{host}:{port}")
            nursery.cancel_scope.cancel()
    message = dialer.stderr.decode()
    assert dialer.returncode == 1
    assert wrong in message and peer.keypair.hex in message
    assert "Traceback" not in message
    assert dialer.stdout == b""


async def test_beam_reports_a_refused_connection_in_one_line():
    result = await cosmicac("beam", "ab" * 32, "--address", f"127.0.0.1:{unused_port()}")
    assert result.returncode == 1
    assert "connection refused" in result.stderr.decode()
    assert len(result.stderr.decode().strip().splitlines()) == 1


async def test_beam_rejects_a_malformed_key_as_a_usage_error():
    result = await cosmicac("beam", "not-a-key", "--address", "127.0.0.1:9")
    assert result.returncode == 2
    assert "64 hex characters" in result.stderr.decode()


def unused_port():
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_beam_help_lists_its_modes():
    result = invoke(["beam", "--help"])
    assert result.returncode == 0
    assert b"--listen" in result.stdout and b"--address" in result.stdout


async def test_beam_finds_the_listener_by_key_through_the_dht(tmp_path):
    from p2p.dht.testnet import udp_testnet

    to_dialer, to_listener = os.urandom(1 << 20), os.urandom(1 << 20)
    (tmp_path / "listener.in").write_bytes(to_dialer)
    with trio.fail_after(120):
        async with udp_testnet(6) as net, trio.open_nursery() as nursery:
            bootstrap = "{}:{}".format(*net.bootstrap[0])
            stdin = open_fd(tmp_path / "listener.in", os.O_RDONLY)
            stdout = open_fd(tmp_path / "listener.out", os.O_WRONLY | os.O_CREAT)
            try:
                listener = await trio.lowlevel.open_process(
                    [*BEAM, "--listen", "--bootstrap", bootstrap],
                    stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                )
            finally:
                os.close(stdin)
                os.close(stdout)
            nursery.start_soon(_reap, listener)
            match = await read_until(listener.stderr, re.compile(r"key ([0-9a-f]{64}) \(announced"))
            dialer = await trio.run_process(
                [*BEAM, match[1], "--bootstrap", bootstrap],
                stdin=to_listener, capture_stdout=True, capture_stderr=True, check=False,
            )
            assert dialer.returncode == 0, dialer.stderr.decode()
            assert await listener.wait() == 0
    assert dialer.stdout == to_dialer
    got = (tmp_path / "listener.out").read_bytes()
    # Regression: the listener's handler was cancelled when the dialer hung up,
    # before it had read the last messages, and still exited 0.
    assert got == to_listener, f"the listener got {len(got)} of {len(to_listener)} bytes"


async def test_beam_by_key_reports_a_key_nobody_announced():
    from p2p.dht.testnet import udp_testnet

    with trio.fail_after(60):
        async with udp_testnet(3) as net:
            result = await cosmicac("beam", "ab" * 32, "--bootstrap",
                                    "{}:{}".format(*net.bootstrap[0]))
    assert result.returncode == 1
    assert "is announced on the DHT" in result.stderr.decode()
    assert "Traceback" not in result.stderr.decode()  # one line, even from inside a nursery
