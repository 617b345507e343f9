"""Shell sessions through real swarms on 127.0.0.1 (real PTYs and processes).

These tests wait on real time (processes and terminals do not run on trio's
clock): every wait is on a condition, bounded by ``fail_after``.
"""

from __future__ import annotations

import logging

import pytest
import trio

from agents.instance import PROTOCOL, ShellError, ShellService, Stderr, Stdout, open_shell
from agents.instance._protocol import Error, decode_server, encode
from p2p.errors import P2PError
from p2p.keys import KeyPair
from tests.p2p.swarm.helpers import swarm_net

pytestmark = pytest.mark.slow

LIMIT_S = 10


async def read_until(session, needle: bytes, seen: bytearray, *, count: int = 1) -> None:
    """Read output into ``seen`` until ``needle`` occurs ``count`` times."""
    async for event in session:
        seen += event.data
        if seen.count(needle) >= count:
            return
    pytest.fail(f"the process exited before {needle!r} appeared: {bytes(seen)!r}")


async def agent_and_user(net, *, authorized=(), peers=(), shell="/bin/sh"):
    user = KeyPair.generate()
    keys = {user.public_key} if authorized is None else set(authorized)
    service = ShellService(keys.__contains__, peers=set(peers).__contains__, shell=shell)
    agent = await net.start(services=[service])
    client = await net.start(user)
    return service, agent, client, user


async def test_an_interactive_shell_echoes_resizes_and_returns_its_exit_status(caplog):
    caplog.set_level(logging.INFO, logger="agents.instance.shell")
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            async with await open_shell(connection, term="vt100", rows=30, cols=100) as session:
                seen = bytearray()
                await session.send_stdin(b"echo $TERM; stty size\n")
                await read_until(session, b"30 100", seen)
                assert b"vt100" in seen
                await session.send_stdin(b"echo hi\n")
                await read_until(session, b"hi", seen, count=2)  # the echo, then the output
                await session.resize(50, 132)
                await session.send_stdin(b"stty size\n")
                await read_until(session, b"50 132", seen)
                await session.send_stdin(b"exit 3\n")
                status = await session.wait_exit()
            assert (status.code, status.signal) == (3, None)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("shell.session_started") and "mode=pty" in m for m in messages)
    assert any(m.startswith("shell.session_ended") and m.endswith("exit=3") for m in messages)


async def test_a_command_gets_pipes_separate_stdout_and_stderr_and_its_exit_code():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(
                connection, argv=["sh", "-c", "echo out; echo err >&2; test -t 0; exit 5"])
            out, err = bytearray(), bytearray()
            async for event in session:
                (out if isinstance(event, Stdout) else err).extend(event.data)
                assert isinstance(event, Stdout | Stderr)
            status = await session.wait_exit()
            assert (bytes(out), bytes(err), status.code) == (b"out\n", b"err\n", 5)


async def test_stdin_eof_ends_cat_and_a_signal_kills():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection, argv=["cat"])
            await session.send_stdin(b"x" * 100_000)  # more than one frame, more than a pipe
            await session.close_stdin()
            out = bytearray()
            async for event in session:
                out += event.data
            assert len(out) == 100_000 and (await session.wait_exit()).code == 0

            sleeper = await open_shell(connection, argv=["sleep", "30"])
            await sleeper.signal("TERM")
            assert (await sleeper.wait_exit()).signal == 15


async def test_several_sessions_run_at_once():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            service, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            sessions = [await open_shell(connection, argv=["cat"]) for _ in range(3)]
            assert service.sessions == 3
            # Each answers on its own, in reverse order: none waits for another.
            for number, session in reversed(list(enumerate(sessions))):
                await session.send_stdin(b"session %d\n" % number)
                assert (await session.receive()).data == b"session %d\n" % number
            for session in sessions:
                await session.close_stdin()
                assert (await session.wait_exit()).code == 0


async def test_closing_the_session_hangs_up_on_the_process():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            service, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection)
            await session.aclose()
            while service.sessions:  # noqa: ASYNC110 - the service's counter, real time
                await trio.sleep(0.02)


async def test_an_unauthorised_key_is_refused_before_any_channel_opens():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            service, agent, client, _ = await agent_and_user(net, authorized=[b"\1" * 32])
            # The agent's firewall drops the connection after the handshake: the
            # channel never opens (the dial itself may also see the refusal).
            with pytest.raises((P2PError, trio.BrokenResourceError)) as caught:
                connection = await client.connect(agent.public_key)
                await open_shell(connection)
            assert not isinstance(caught.value, ShellError), caught.value
            assert service.sessions == 0 and agent.connections == {}


async def test_a_peer_allowed_for_another_reason_gets_no_shell():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            worker = KeyPair.generate()
            service = ShellService(lambda key: False, peers={worker.public_key}.__contains__)
            agent = await net.start(services=[service])
            client = await net.start(worker)
            connection = await client.connect(agent.public_key)
            with pytest.raises(ShellError) as caught:
                await open_shell(connection)
            assert caught.value.code == "unauthorized"
            assert service.sessions == 0


async def test_a_command_that_cannot_start_is_reported():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            with pytest.raises(ShellError) as caught:
                await open_shell(connection, argv=["/nonexistent/command"])
            assert caught.value.code == "spawn_failed"
            assert PROTOCOL == "cosmicac-shell/1"


async def test_a_bad_first_frame_is_answered_with_a_protocol_error():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            service, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            channel = await connection.open_channel(PROTOCOL, b"raw")
            await channel.send(b"\xc1 not msgpack")
            answer = decode_server(await channel.receive())
            assert isinstance(answer, Error) and answer.code == "protocol"
            assert service.sessions == 0


async def test_a_bad_frame_mid_session_hangs_up_on_the_process():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            service, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection, argv=["sleep", "30"])
            await session.channel.send(encode(Stdout(b"a server frame")))
            with pytest.raises(ShellError) as caught:
                await session.wait_exit()
            assert caught.value.code == "protocol"
            while service.sessions:  # noqa: ASYNC110 - the service's counter, real time
                await trio.sleep(0.02)


async def test_a_client_that_does_not_read_stalls_the_process():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection, argv=["yes"])
            received = [-1]
            for _ in range(40):  # nothing read: the channel fills its window, then stops
                await trio.sleep(0.1)
                received.append(session.channel.statistics().bytes_received)
                if received[-1] == received[-2] > 0:
                    break
            await trio.sleep(0.3)
            received.append(session.channel.statistics().bytes_received)
            stalled = received[-1]
            assert 0 < received[-3] == received[-2] == stalled
            assert stalled <= 2 * session.channel.statistics().receive_window_bytes
            # Reading returns credit (in batches), and the process goes on.
            while session.channel.statistics().bytes_received == stalled:
                await session.receive()
            await session.signal("KILL")
            assert (await session.wait_exit()).signal == 9


async def test_stdin_eof_on_a_terminal_types_the_eof_character():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection, argv=["cat"], pty=True)
            await session.close_stdin()
            assert (await session.wait_exit()).code == 0


async def test_output_left_when_the_process_exits_drains_at_the_clients_pace(monkeypatch):
    monkeypatch.setattr("agents.instance._server._DRAIN_S", 0.2)
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection, argv=["head", "-c", "3000000", "/dev/zero"])
            await trio.sleep(0.8)  # the process exits long before we read
            total = 0
            async for event in session:
                total += len(event.data)
            assert (total, (await session.wait_exit()).code) == (3_000_000, 0)


async def test_a_background_job_holding_the_terminal_does_not_hold_the_session(monkeypatch):
    monkeypatch.setattr("agents.instance._server._DRAIN_S", 0.2)
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            # The job ignores the hang-up and keeps the terminal open for 3 s.
            session = await open_shell(connection, pty=True,
                                       argv=["sh", "-c", "trap '' HUP; sleep 3 & exit 7"])
            with trio.fail_after(1.5):
                assert (await session.wait_exit()).code == 7


async def test_a_signal_overtakes_input_the_process_does_not_read():
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net, trio.open_nursery() as nursery:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection, argv=["sleep", "30"])
            # More than the pipe holds, less than the pipe and the agent's input
            # queue (4 frames of 256 KiB): the agent still reads the frames that follow.
            nursery.start_soon(session.send_stdin, b"x" * 150_000)
            await trio.sleep(0.3)
            await session.signal("TERM")
            assert (await session.wait_exit()).signal == 15
            nursery.cancel_scope.cancel()


async def test_session_start_and_end_go_to_the_jobs_system_log(caplog):
    caplog.set_level(logging.INFO, logger="cosmicac.agent.system")
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            user = KeyPair.generate()
            service = ShellService({user.public_key}.__contains__, job_id="job-42")
            agent = await net.start(services=[service])
            client = await net.start(user)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection, argv=["sh", "-c", "cat; exit 4"])
            await session.send_stdin(b"12345")
            await session.close_stdin()
            assert b"".join([event.data async for event in session]) == b"12345"
            assert (await session.wait_exit()).code == 4
            async with await open_shell(connection) as shell:  # a PTY, hung up on
                await shell.send_stdin(b"echo ok\n")
                await read_until(shell, b"ok", bytearray(), count=2)
            while service.sessions:  # noqa: ASYNC110 - the service's counter, real time
                await trio.sleep(0.02)
    records = [r for r in caplog.records if r.name == "cosmicac.agent.system"]
    assert [r.event for r in records] == ["shell.session_started", "shell.session_ended"] * 2
    assert all(r.job_id == "job-42" and r.source == "System" for r in records)
    assert all(r.user_key == user.public_key.hex() for r in records)
    started, ended, pty_started, pty_ended = records
    assert (started.mode, started.argv) == ("exec", ["sh", "-c", "cat; exit 4"])
    assert (ended.exit_code, ended.exit_signal, ended.hangup) == (4, None, False)
    assert (ended.bytes_in, ended.bytes_out) == (5, 5) and ended.duration_s >= 0
    assert "exit_code=4" in ended.getMessage() and "user_key=" in ended.getMessage()
    assert (pty_started.mode, pty_started.argv) == ("pty", None)
    assert pty_ended.hangup and pty_ended.exit_code is None
    assert pty_ended.bytes_in == len(b"echo ok\n") and pty_ended.bytes_out > 0


async def test_the_system_log_names_no_job_when_none_was_given(caplog):
    caplog.set_level(logging.INFO, logger="cosmicac.agent.system")
    with trio.fail_after(LIMIT_S):
        async with swarm_net() as net:
            _, agent, client, _ = await agent_and_user(net, authorized=None)
            connection = await client.connect(agent.public_key)
            session = await open_shell(connection, argv=["true"])
            assert (await session.wait_exit()).code == 0
            await session.aclose()
            while agent_sessions(agent):  # noqa: ASYNC110 - real time
                await trio.sleep(0.02)
    records = [r for r in caplog.records if r.name == "cosmicac.agent.system"]
    assert [r.job_id for r in records] == [None, None]


def agent_sessions(agent) -> int:
    return sum(getattr(s, "sessions", 0) for s in agent.host.services.values())
