"""A shell's background processes stay its key's, and end when the key loses access.

The test process itself becomes a child subreaper for each test (the agent's own
process does, in production) and stops being one after; every process a test
starts is killed and reaped at teardown. Real processes, real time: every wait
is on a condition, bounded in time.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agents.instance import Descendants, ShellService, become_subreaper, open_shell
from agents.instance._descendants import PR_SET_CHILD_SUBREAPER, session_preexec
from p2p.keys import KeyPair
from tests.p2p.swarm.helpers import swarm_net

LIMIT_S = 15


def alive(pid: int) -> bool:
    """Running (a zombie, ended but not yet collected, is not)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


def read_pid(path: Path, deadline_s: float = LIMIT_S) -> int:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text())
        time.sleep(0.02)
    raise TimeoutError(f"no pid in {path}")


@pytest.fixture
def subreaper() -> Iterator[list[int]]:
    """This process adopts orphans for the test; yields a list of pids to end after."""
    if not become_subreaper():
        pytest.skip("this kernel refuses PR_SET_CHILD_SUBREAPER")
    leftovers: list[int] = []
    try:
        yield leftovers
    finally:
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in leftovers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)  # ours if adopted; ECHILD otherwise


async def wait_for(predicate, what: str) -> None:
    with trio.fail_after(LIMIT_S):
        while not predicate():  # noqa: ASYNC110 - real processes, real time
            await trio.sleep(0.02)


def background(pidfile: Path) -> str:
    """A shell line that leaves a process in a session of its own, writing its pid."""
    return f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 120' </dev/null >/dev/null 2>&1 &"


async def test_a_removed_keys_background_process_dies_and_a_members_lives_on(
        subreaper, tmp_path):
    alice, bob = KeyPair.generate(), KeyPair.generate()
    keys = {alice.public_key, bob.public_key}
    descendants = Descendants()
    service = ShellService(keys.__contains__, shell="/bin/sh", descendants=descendants)
    with trio.fail_after(LIMIT_S * 2):
        async with swarm_net() as net, trio.open_nursery() as nursery:
            nursery.start_soon(service.watch_descendants, 0.05)
            agent = await net.start(services=[service])
            pids = {}
            for who, name in ((alice, "alice"), (bob, "bob")):
                client = await net.start(who)
                connection = await client.connect(agent.public_key)
                # An interactive shell that starts a daemon and logs out.
                session = await open_shell(connection, pty=True)
                pidfile = tmp_path / name
                await session.send_stdin(f"{background(pidfile)}\nexit 0\n".encode())
                assert (await session.wait_exit()).code == 0
                pids[name] = read_pid(pidfile)
                subreaper.append(pids[name])
            # Logging out ends no background process: a member may leave a job running.
            await wait_for(lambda: pids["alice"] in descendants.pids(alice.public_key)
                           and pids["bob"] in descendants.pids(bob.public_key), "attributed")
            assert alive(pids["alice"]) and alive(pids["bob"])

            keys.discard(alice.public_key)  # Alice leaves the team
            service.close_unauthorized("removed")
            await wait_for(lambda: not alive(pids["alice"]), "alice's daemon ends")
            assert alive(pids["bob"])
            assert descendants.killed_total == 1
            # The next scan collects it (it was adopted: nobody else would).
            await wait_for(lambda: not descendants.pids(alice.public_key), "forgotten")
            assert not os.path.exists(f"/proc/{pids['alice']}")  # noqa: ASYNC240
            nursery.cancel_scope.cancel()


async def test_a_command_that_orphans_a_process_and_exits_at_once_is_still_its_keys(
        subreaper, tmp_path):
    """The first process ends before any scan saw its child: the orphan goes to the
    one key whose process ended in that window."""
    alice = KeyPair.generate()
    keys = {alice.public_key}
    descendants = Descendants()
    service = ShellService(keys.__contains__, descendants=descendants)
    with trio.fail_after(LIMIT_S * 2):
        async with swarm_net() as net, trio.open_nursery() as nursery:
            agent = await net.start(services=[service])
            client = await net.start(alice)
            connection = await client.connect(agent.public_key)
            pidfile = tmp_path / "daemon"
            session = await open_shell(connection, argv=["sh", "-c", background(pidfile)])
            assert (await session.wait_exit()).code == 0
            pid = read_pid(pidfile)
            subreaper.append(pid)
            nursery.start_soon(service.watch_descendants, 0.05)
            await wait_for(lambda: pid in descendants.pids(alice.public_key), "attributed")

            keys.clear()
            service.close_unauthorized("removed")
            await wait_for(lambda: not alive(pid), "the daemon ends")
            assert descendants.unattributed_total == 0
            nursery.cancel_scope.cancel()


async def test_a_double_forked_daemon_of_a_running_session_is_its_keys(subreaper, tmp_path):
    """The session's shell is a subreaper too: its own orphans stay under it."""
    alice = KeyPair.generate()
    keys = {alice.public_key}
    descendants = Descendants()
    service = ShellService(keys.__contains__, descendants=descendants)
    with trio.fail_after(LIMIT_S * 2):
        async with swarm_net() as net, trio.open_nursery() as nursery:
            nursery.start_soon(service.watch_descendants, 0.05)
            agent = await net.start(services=[service])
            client = await net.start(alice)
            connection = await client.connect(agent.public_key)
            pidfile = tmp_path / "daemon"
            # ( … & ): the subshell exits at once; its child is orphaned while the
            # session's shell still runs, and goes to that shell, not to init.
            session = await open_shell(
                connection, argv=["sh", "-c", f"({background(pidfile)}); exec cat"])
            pid = read_pid(pidfile)
            subreaper.append(pid)
            await wait_for(lambda: pid in descendants.pids(alice.public_key), "attributed")
            keys.clear()
            service.close_unauthorized("removed")
            await wait_for(lambda: not alive(pid), "the daemon ends")
            with pytest.raises(Exception):  # noqa: B017 - the session was revoked
                await session.wait_exit()
            nursery.cancel_scope.cancel()


def spawn_root(command: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sh", "-c", command], start_new_session=True,
                            preexec_fn=session_preexec)


def test_an_orphan_is_left_unnamed_when_two_keys_processes_ended_at_once(subreaper, tmp_path):
    descendants = Descendants()
    first, second = tmp_path / "first", tmp_path / "second"
    roots = [(spawn_root(background(first)), b"a" * 32),
             (spawn_root(background(second)), b"b" * 32)]
    for root, key in roots:
        descendants.started(root.pid, key)
    orphans = [read_pid(first), read_pid(second)]
    subreaper.extend(orphans)
    for root, _ in roots:
        root.wait(timeout=LIMIT_S)
        descendants.ended(root.pid)
    descendants.scan()
    assert descendants.unattributed_total == 2
    assert descendants.owners() == set()
    # Nobody's revocation kills them: they are nobody's.
    assert descendants.end_key(b"a" * 32) == 0
    assert all(alive(pid) for pid in orphans)


KEY = b"k" * 32


@pytest.fixture
def session_daemon(subreaper, tmp_path) -> Iterator[tuple[Descendants, int, int]]:
    """A session of KEY's whose first process left a daemon running and ended:
    (descendants, the first process's pid, the daemon's pid), the daemon seen by a scan."""
    descendants = Descendants()
    pidfile = tmp_path / "daemon"
    root = spawn_root(background(pidfile))
    descendants.started(root.pid, KEY)
    pid = read_pid(pidfile)
    subreaper.append(pid)
    descendants.scan()  # seen under its first process: the key's
    yield descendants, root.pid, pid
    root.wait(timeout=LIMIT_S)
    descendants.ended(root.pid)


def test_a_reused_pid_is_never_signalled(session_daemon):
    descendants, root, pid = session_daemon
    assert descendants.pids(KEY) == sorted([root, pid])
    # The record now says the pid started at another time: it names another process.
    descendants._owned[pid].start += 1
    assert descendants.signal(KEY) == set()
    assert alive(pid)


def test_a_process_sent_sigkill_is_killed_and_counted_once_however_often_revoked(
        session_daemon, monkeypatch):
    """A SIGKILL lands a moment after it is sent (later on a busy machine): the
    revocation pass that runs meanwhile neither resends it nor counts it again."""
    descendants, _, _ = session_daemon
    sent: list[int] = []
    # The signal "has not landed yet" for as long as the test likes.
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, signum: sent.append(signum))
    assert descendants.end_key(KEY) == 1
    assert descendants.end_key(KEY) == 0
    assert sent == [signal.SIGKILL]
    assert descendants.killed_total == 1


def test_a_session_being_spawned_is_not_taken_for_a_revoked_keys_orphan(session_daemon):
    """A revocation runs while another key's session is spawned: its first process is
    already our child but not yet started() (trio forks in a thread). Seen in CI: it
    was named the revoked key's (the one key whose processes had just ended) and
    SIGKILLed; the member's command died by signal 9."""
    descendants, _, _ = session_daemon
    other = b"o" * 32
    # The revocation: KEY's daemon killed; what it leaves orphaned is KEY's until
    # the next scan (so the one key whose processes ended is KEY).
    assert descendants.end_key(KEY) == 1
    with descendants.spawning():
        child = spawn_root("exec sleep 30")
        # The watcher's pass runs while the fork is in its thread: the child may be
        # named KEY's for now, but is not signalled while a spawn runs.
        descendants.scan()
        assert descendants.end_key(KEY) == 0
        assert alive(child.pid)
        descendants.started(child.pid, other)  # named right: ``other``'s
    assert descendants.end_key(KEY) == 0 and alive(child.pid)
    descendants.scan()
    assert descendants.pids(other) == [child.pid] and alive(child.pid)
    child.kill()
    child.wait(timeout=LIMIT_S)
    descendants.ended(child.pid)


def test_without_the_guard_such_a_child_would_be_named_the_ended_key(session_daemon):
    """The case the guard exists for, shown without it: the scan's orphan rule names
    an unknown child of ours the one key whose processes ended."""
    descendants, _, _ = session_daemon
    descendants.end_key(KEY)
    child = spawn_root("exec sleep 30")
    try:
        descendants._ended.add(KEY)  # as end_key leaves it between its rounds
        descendants.scan()
        assert child.pid in descendants.pids(KEY)
    finally:
        child.kill()
        child.wait(timeout=LIMIT_S)
