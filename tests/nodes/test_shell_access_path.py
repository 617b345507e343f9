"""Shell access follows the team through real processes.

wrk-ork and a ``local``-backend worker run as processes (tests/nodes/control_path.py);
the test calls ``teams.set_shell_keys`` as app-node does. The new set crosses
wrk-ork's outbox and the durable queue, the worker's file and its agent channel,
and the running agent closes the removed member's session; after the worker is
killed and started again, the next set still reaches the same agent.
"""

from __future__ import annotations

import re

import pytest
import trio

from agents.instance import ShellError, open_shell
from contracts.model import JobSpec
from contracts.ork import SET_SHELL_KEYS
from contracts.shell_access import ShellKeys
from p2p.connection import dial_tcp
from p2p.errors import P2PError
from p2p.keys import KeyPair

from .control_path import control_path
from .ork_driver import IMAGE, status

pytestmark = pytest.mark.slow

#: The promise: a removed member's session ends, a new key works, within seconds.
DEADLINE_S = 10.0
#: A process that leaves the session's group and session, says its pid, and stays.
BACKGROUND = "setsid sh -c 'echo $$; exec sleep 120 >/dev/null 2>&1' </dev/null &"
STARTED = re.compile(r"agent\.started .* key=([0-9a-f]{64}) address=([\d.]+):(\d+)")


def running(pid: int) -> bool:
    """Alive and not a zombie (an ended process its parent has not collected yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


async def try_shell(path, where, user: KeyPair, argv):
    host, port, key = where
    connection = await dial_tcp(host, port, user, key)
    await path.nursery.start(connection.run)
    return await open_shell(connection, argv=argv)


async def wait_for_shell(path, where, user: KeyPair, argv):
    """A session for ``user`` as soon as the agent lets them in (bounded)."""
    with trio.fail_after(DEADLINE_S):
        while True:
            try:
                return await try_shell(path, where, user, argv)
            except (P2PError, OSError, trio.BrokenResourceError, ShellError):
                await trio.sleep(0.1)


async def refused(path, where, user: KeyPair) -> bool:
    try:
        session = await try_shell(path, where, user, ["true"])
    except (P2PError, OSError, trio.BrokenResourceError, ShellError):
        return True
    await session.aclose()
    return False


async def test_a_removed_member_loses_the_shell_across_processes_and_a_worker_restart(
        tmp_path):
    alice, bob = KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(150):
        async with control_path(tmp_path) as path:
            job = await path.create(JobSpec(name="box", team="t1", type="container",
                                            image=IMAGE, gpus=1,
                                            authorized_keys=(alice.hex,)))
            await path.wait_job(job.id, status("active"))
            (folder,) = path.vmi_folders()
            found = STARTED.search((folder / "agent.log").read_text())
            assert found, (folder / "agent.log").read_text()
            where = (found[2], int(found[3]), bytes.fromhex(found[1]))

            # Alice leaves a daemon behind (a session of its own, orphaned at once).
            daemon = await try_shell(path, where, alice, ["sh", "-c", BACKGROUND])
            pid = int((await daemon.receive()).data)
            assert (await daemon.wait_exit()).code == 0
            assert running(pid)
            session = await try_shell(path, where, alice, ["cat"])
            await session.send_stdin(b"hello\n")
            assert (await session.receive()).data == b"hello\n"
            ack = await path.call(SET_SHELL_KEYS, ShellKeys(team="t1", keys=(bob.hex,),
                                                            version=1))
            assert ack.applied
            with trio.fail_after(DEADLINE_S), pytest.raises(ShellError) as closed:
                await session.wait_exit()
            assert closed.value.code == "revoked"
            with trio.fail_after(DEADLINE_S):  # her daemon went with her access
                while running(pid):  # noqa: ASYNC110 - another process's state
                    await trio.sleep(0.05)
            bobs = await wait_for_shell(path, where, bob, ["sh", "-c", "exit 4"])
            assert (await bobs.wait_exit()).code == 4
            assert await refused(path, where, alice)

            await path.kill_worker()
            await path.start_worker()
            bobs = await try_shell(path, where, bob, ["cat"])
            await path.call(SET_SHELL_KEYS, ShellKeys(team="t1", keys=(alice.hex,), version=2))
            with trio.fail_after(DEADLINE_S), pytest.raises(ShellError) as closed:
                await bobs.wait_exit()
            assert closed.value.code == "revoked"
            alices = await wait_for_shell(path, where, alice, ["sh", "-c", "exit 5"])
            assert (await alices.wait_exit()).code == 5
