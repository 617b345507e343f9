"""`cosmicac shell` against a shell service on a real swarm.

The agent side runs in the test process (a swarm on 127.0.0.1 serving
:class:`ShellService`). A session moves bytes on the CLI's own file descriptors 0, 1
and 2 and takes its signals: where one runs, the CLI is a subprocess, its stdin and
stdout pipes or a PTY the test holds; a command that fails before its session starts
runs in this process. Real time: every wait is on a condition, bounded. (A command's
stdout, stderr and exit status coming back apart: test_shell_startup.py's run, which
also lists the modules that run loaded.)

``cosmicac shell JOB`` runs against a real app-node API (``create_app`` on a
socket) over a real in-process wrk-ork (the ``ork_api`` fixture of the API
tests): the job's replica reports its agent's key as a worker would, and the
agent is a swarm on a real-UDP DHT whose bootstrap app-node advertises at
``GET /api/swarm``.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import struct
import subprocess
import termios
from contextlib import asynccontextmanager

import pytest
import trio

from agents.instance import ShellService
from contracts.operations import ReplicaReport
from nodes.app_node.api import create_app
from nodes.app_node.services import SwarmAdvert
from p2p.http import serve_asgi
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.swarm import Swarm, SwarmConfig
from tests.cli.support import cli_env, cosmicac, cosmicac_process, invoke
from tests.nodes.app_node.api.apis import CHEAP, Api, bearer, ork_api  # noqa: F401
from tests.nodes.ork.world import RACK
from tests.p2p.swarm.helpers import swarm_net

from .helpers import COSMICAC

LIMIT_S = 30


@asynccontextmanager
async def agent_for(tmp_path, *, authorized=True):
    """A swarm serving shells; yields the CLI arguments that reach it."""
    user = load_or_create_keypair(tmp_path / "user")
    keys = {user.public_key} if authorized else {b"\1" * 32}
    service = ShellService(keys.__contains__, shell="/bin/sh")
    swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", announce_key=False),
                  services=[service])
    scope = trio.CancelScope()

    async def run_swarm(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await swarm.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(run_swarm)
        yield _Args(["shell", "--agent", swarm.public_key.hex(), "--address", f"{host}:{port}",
                     "--identity", str(tmp_path / "user")], scope.cancel)
        scope.cancel()


class _Args(list):
    """The CLI arguments that reach the agent; ``stop()`` ends the agent."""

    def __init__(self, args, stop):
        super().__init__(args)
        self.stop = stop


async def test_a_command_that_cannot_start_exits_127_as_in_a_shell(tmp_path):
    # In this process: the agent refuses to spawn it, before any session starts.
    with trio.fail_after(LIMIT_S):
        async with agent_for(tmp_path) as args:
            result = await cosmicac(*args, "--", "/nonexistent/command")
    assert result.returncode == 127
    assert "/nonexistent/command: No such file" in result.stderr.decode()


async def test_stdin_that_is_not_a_terminal_is_the_commands_input(tmp_path):
    with trio.fail_after(LIMIT_S):
        async with agent_for(tmp_path) as args:
            data = os.urandom(300_000)
            result = await trio.run_process(
                [*COSMICAC, *args, "--", "sh", "-c", "cat; kill -TERM $$"],
                stdin=data, capture_stdout=True, capture_stderr=True, check=False)
    assert result.stdout == data
    assert result.returncode == 128 + signal.SIGTERM, result.stderr.decode()


def set_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """The test's side of a PTY the CLI runs on."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.seen = bytearray()

    async def read_until(self, needle: bytes, *, count: int = 1) -> None:
        while self.seen.count(needle) < count:
            await trio.lowlevel.wait_readable(self.master)
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the CLI closed the terminal
                chunk = b""
            assert chunk, f"the terminal closed before {needle!r}: {bytes(self.seen)!r}"
            self.seen += chunk

    def type(self, text: bytes) -> None:
        os.write(self.master, text)


async def test_an_interactive_session_on_a_terminal_echoes_resizes_and_exits(tmp_path):
    master, slave = os.openpty()
    set_size(slave, 30, 100)
    before = termios.tcgetattr(slave)
    terminal = Terminal(master)
    try:
        with trio.fail_after(LIMIT_S):
            async with agent_for(tmp_path) as args:
                process = await trio.lowlevel.open_process(
                    [*COSMICAC, *args], stdin=slave, stdout=slave, stderr=subprocess.PIPE,
                    env={**os.environ, "TERM": "vt100"}, start_new_session=True)
                try:
                    terminal.type(b"echo $TERM; stty size\n")
                    await terminal.read_until(b"30 100")
                    assert b"vt100" in terminal.seen
                    terminal.type(b"echo hi\n")
                    await terminal.read_until(b"hi", count=2)  # the echo, then the output
                    # The local terminal is raw while the session runs.
                    assert not termios.tcgetattr(slave)[3] & termios.ECHO
                    set_size(slave, 50, 132)
                    process.send_signal(signal.SIGWINCH)
                    for _ in range(50):  # the resize and the next line race: ask again
                        terminal.type(b"stty size\n")
                        with trio.move_on_after(0.5):
                            await terminal.read_until(b"50 132")
                            break
                    assert b"50 132" in terminal.seen
                    terminal.type(b"exit 3\n")
                    assert await process.wait() == 3
                    assert await process.stderr.receive_some() in (b"", None)
                finally:
                    if process.returncode is None:
                        process.kill()
        assert termios.tcgetattr(slave) == before  # restored on the way out
    finally:
        os.close(master)
        os.close(slave)


async def test_an_unauthorised_key_exits_255_with_one_clear_line(tmp_path):
    with trio.fail_after(LIMIT_S):
        async with agent_for(tmp_path, authorized=False) as args:
            result = await cosmicac(*args, "--", "true")
    message = result.stderr.decode()
    assert result.returncode == 255, message
    assert "not one of the job's authorised keys" in message
    assert load_or_create_keypair(tmp_path / "user").hex in message
    assert len(message.strip().splitlines()) == 1 and result.stdout == b""


async def test_an_agent_that_goes_away_mid_session_exits_255_with_one_line(tmp_path):
    with trio.fail_after(LIMIT_S):
        async with agent_for(tmp_path) as args, trio.open_nursery() as nursery:
            process = await trio.lowlevel.open_process(
                [*COSMICAC, *args, "--", "sh", "-c", "echo started; exec sleep 30"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            nursery.start_soon(process.wait)
            assert await process.stdout.receive_some() == b"started\n"
            args.stop()  # the agent's swarm ends
            message = (await process.stderr.receive_some()).decode()
            assert await process.wait() == 255, message
    assert "broke" in message or "without an exit status" in message, message
    assert len(message.strip().splitlines()) == 1


async def test_an_unreachable_agent_exits_255_with_one_line(tmp_path):
    with trio.fail_after(LIMIT_S):
        result = await cosmicac(
            "shell", "--agent", "ab" * 32, "--address", f"127.0.0.1:{unused_port()}",
            "--identity", str(tmp_path / "user"), "--", "true")
    message = result.stderr.decode()
    assert result.returncode == 255, message
    assert "cannot reach agent abababababab" in message
    assert len(message.strip().splitlines()) == 1


@pytest.mark.parametrize("args, needle", [
    (["shell", "--address", "127.0.0.1:9"], "--agent"),
    (["shell", "--agent", "nope", "--address", "127.0.0.1:9"], "64 hex"),
    (["shell", "--agent", "ab" * 32], "--address"),
])
def test_usage_errors_exit_2(tmp_path, args, needle):
    result = invoke([*args, "--identity", str(tmp_path / "user")])
    assert result.returncode == 2 and needle in result.stderr.decode(), result.stderr


def unused_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- cosmicac shell JOB: the agent found through app-node -------------------------


IMAGE = "docker://registry.local/jobs/app:1"


async def logged_in(tmp_path, api: Api, nursery) -> tuple[dict[str, str], str]:
    """Serve ``api`` on a socket, sign up, save the CLI's session; (the CLI's env, token)."""
    host, port = await nursery.start(lambda task_status: serve_asgi(
        create_app(api.services, password_params=CHEAP), host="127.0.0.1", port=0,
        bind_error=lambda h, p, c: c, task_status=task_status))
    server = f"http://{host}:{port}"
    token = await api.signup()
    config = tmp_path / "config"
    config.mkdir()
    (config / "session.json").write_text(json.dumps({
        "server": server, "token": token, "expires_at": 4e9, "email": "admin@example.com"}))
    return cli_env(config, server), token


async def make_job(api: Api, token: str, kind: str = "container") -> str:
    body = {"name": kind, "type": kind, "image": IMAGE, "gpus": 1}
    if kind == "inference":
        body.update(runtime="vllm", model="demo", replicas=1)
    r = await api.client.post("/api/jobs", headers=bearer(token), json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def report_active(api: Api, job: str, agents: tuple[str, ...]) -> None:
    """The worker's report: replica 0 is active with these agents; once wrk-ork
    streamed it (as its daemon does after each report) and app-node's copy of the
    jobs has it."""
    world = api.world
    assert world is not None and api.ork_service is not None
    generation = world.orch.get_job(job).replicas[0].generation
    world.now += 1
    world.orch.on_report(RACK, ReplicaReport(job_id=job, replica=0, state="active",
                                             generation=generation, agents=agents,
                                             at=world.now), world.now)
    api.ork_service.pump()
    await api.settled()


async def cli(env, *args, process: bool = False):
    """``cosmicac shell *args``: in this process, or as a real one with ``process`` (a
    session runs: it needs the process's own file descriptors)."""
    with trio.fail_after(LIMIT_S):
        run = cosmicac_process if process else cosmicac
        return await run("shell", *args, env=env)


def one_line(result) -> str:
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.slow
async def test_shell_job_reaches_the_agent_app_node_lists_through_the_advertised_dht(
        tmp_path, ork_api: Api, nursery) -> None:  # noqa: F811
    api = ork_api
    env, token = await logged_in(tmp_path, api, nursery)
    user = load_or_create_keypair(tmp_path / "config" / "user")  # what login registers
    api.services.store.users.set_cli_key(api.services.store.users.by_email(
        "admin@example.com").id, user.hex)
    job = await make_job(api, token)
    with trio.fail_after(LIMIT_S * 2):
        async with swarm_net(dht_nodes=3) as net:
            agent = await net.start(services=[ShellService({user.public_key}.__contains__,
                                                           shell="/bin/sh")])
            await report_active(api, job, (agent.public_key.hex(),))

            nothing = await cli(env, job, "--", "true")
            assert nothing.returncode == 255
            assert "advertises no DHT bootstrap" in one_line(nothing)

            api.services.swarm = SwarmAdvert(
                bootstrap=tuple(f"{h}:{p}" for h, p in net.bootstrap))
            result = await cli(env, job, "--", "sh", "-c", "echo hi; exit 3", process=True)
            assert result.stdout == b"hi\n", result.stderr
            assert result.returncode == 3  # the command's own status

            other = await cli(env, job, "--replica", "1", "--", "true")
            assert other.returncode == 255 and "no replica 1" in one_line(other)


@pytest.mark.slow
async def test_shell_job_failures_are_one_line_and_exit_255(
        tmp_path, ork_api: Api, nursery) -> None:  # noqa: F811
    api = ork_api
    env, token = await logged_in(tmp_path, api, nursery)
    queued = await make_job(api, token)
    model = await make_job(api, token, "inference")
    await report_active(api, model, ("cd" * 32,))

    unknown = await cli(env, "no-such-job", "--", "true")
    assert unknown.returncode == 255 and "no-such-job" in one_line(unknown)
    waiting = await cli(env, queued, "--", "true")
    assert waiting.returncode == 255
    assert "not running" in one_line(waiting) and f"cosmicac jobs get {queued}" in \
        one_line(waiting)
    inference = await cli(env, model, "--", "true")
    assert inference.returncode == 255 and "inference job" in one_line(inference)
    await report_active(api, queued, ())  # active, but its agent did not say hello yet
    hello = await cli(env, queued, "--", "true")
    assert hello.returncode == 255 and "no agent yet" in one_line(hello)

    (tmp_path / "config" / "contexts.json").unlink()  # (the session.json taken in)
    logged_out = await cli(env, queued, "--", "true")
    assert logged_out.returncode == 255 and "cosmicac login" in one_line(logged_out)
    usage = await cli(env)
    assert usage.returncode == 2 and "cosmicac shell JOB" in one_line(usage)


@pytest.mark.slow
async def test_shell_job_pairs_through_the_advertised_relay_by_its_address_with_no_dht(
        tmp_path, ork_api: Api, nursery) -> None:  # noqa: F811
    """A workstation that reaches only the relay box (seeds/relay.txt): app-node
    advertises the relay's key and address, no DHT; the agent, firewalled, holds a
    reservation there; the shell pairs through it."""
    from relay import run_relay

    api = ork_api
    env, token = await logged_in(tmp_path, api, nursery)
    user = load_or_create_keypair(tmp_path / "config" / "user")
    api.services.store.users.set_cli_key(api.services.store.users.by_email(
        "admin@example.com").id, user.hex)
    job = await make_job(api, token)
    relay_key = KeyPair.generate()
    with trio.fail_after(LIMIT_S * 2):
        where = await nursery.start(lambda task_status: run_relay(
            relay_key, host="127.0.0.1", port=0, task_status=task_status))
        known = ((relay_key.public_key, (where.tcp,)),)
        agent = Swarm(KeyPair.generate(), config=SwarmConfig(
            host="127.0.0.1", relays=(relay_key.public_key,), known_peers=known,
            announce_key=False, announce_addresses=((("127.0.0.1", unused_port())),)),
            # Its firewall admits the users' keys and its relay (as an agent's does).
            services=[ShellService({user.public_key, relay_key.public_key}.__contains__,
                                   shell="/bin/sh")])
        await nursery.start(agent.run)
        while relay_key.public_key not in agent.reserved_relays:  # bounded by fail_after
            await agent.reservations_changed.wait()
        await report_active(api, job, (agent.public_key.hex(),))
        api.services.swarm = SwarmAdvert(
            relays=(relay_key.public_key.hex(),),
            relay_addresses=((relay_key.public_key.hex(), (f"{where.tcp[0]}:{where.tcp[1]}",)),))
        result = await cli(env, job, "--", "sh", "-c", "echo through; exit 4", process=True)
        assert result.stdout == b"through\n", result.stderr
        assert result.returncode == 4
        assert agent.connections and all(c.relayed for c in agent.connections.values()
                                         if c.remote_public_key != relay_key.public_key)
