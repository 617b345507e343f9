"""The local backend's fork server: agents forked from a pre-imported zygote keep
every property a spawned agent has (its own user, environment, folder, session,
log, no inherited descriptors), hold no other job's secrets, are adopted after a
worker restart, and the backend spawns again when the zygote is gone.

The agent forked here is a probe (``fork_probe.py``) that prints what it is; the
fork server preloads it in place of ``cosmicac agent run``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from nodes.k8s_worker import local
from nodes.k8s_worker.backend import VmiPhase
from nodes.k8s_worker.local import LocalBackend, LocalClusterSettings
from runtime import forkserver as _forkserver
from runtime.forkserver._protocol import _fds
from tests.agents.helpers import agent_config
from tests.nodes.k8s_worker.test_local_backend import WORKER_KEY, started, unit_of

PROBE = "tests.nodes.k8s_worker.fork_probe"
FAST = LocalClusterSettings(stop_grace_s=0.5, poll_interval_s=0.05, isolation="off")

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents as other users need root")


@pytest.fixture
def probe_forked(monkeypatch):
    """The fork server preloads and runs the probe instead of the agent."""
    monkeypatch.setattr(local, "FORK_PRELOAD", (PROBE,))
    monkeypatch.setattr(local, "FORK_MODULE", PROBE)
    monkeypatch.setattr(local, "FORK_ARGV", ())
    monkeypatch.setattr(local, "FORK_FUNCTION", None)  # run as __main__


def _probe(backend: LocalBackend, vmi) -> dict:
    """The probe's report, from its log."""
    text = (backend.folder(vmi) / "agent.log").read_text()
    found = re.search(r"^probe=(.*)$", text, re.M)
    assert found, text
    return json.loads(found[1])


async def _reported(backend: LocalBackend, vmi) -> dict:
    log = backend.folder(vmi) / "agent.log"
    with trio.move_on_after(20):
        while "probe=" not in _read(log) and backend.pid(vmi.name):  # noqa: ASYNC110
            await trio.sleep(0.02)
    return _probe(backend, vmi)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Does any readable mapping of ``pid`` hold ``needle``? (root reads any process)"""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r") or line.rstrip().endswith("[vvar]"):
                continue
            start, end = (int(part, 16) for part in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except (OSError, OverflowError, ValueError):
                continue
    return False


@pytest.fixture
def deployment():
    """A worker folder others may pass (0711), as ``cosmicac up`` lays it out."""
    folder = Path(tempfile.mkdtemp(prefix="cosmicac-fork-", dir="/tmp"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@as_root
async def test_a_forked_agent_is_its_own_user_and_cannot_reach_another_jobs_data(
        nursery, deployment, probe_forked, monkeypatch):
    for root in local._import_roots():
        if local._unreachable(root):
            pytest.skip(f"{root} is not reachable by other users")
    monkeypatch.setenv("WORKER_ONLY", "not for agents")
    settings = FAST.model_copy(update={"isolation": "require",
                                       "agents_dir": deployment / "agents"})
    mine_config = agent_config(WORKER_KEY, job_id="j-mine")
    theirs_config = agent_config(WORKER_KEY, job_id="j-theirs")
    mine, theirs = unit_of(mine_config), unit_of(theirs_config)
    backend = LocalBackend(settings, deployment / "vmis")
    running = await started(nursery, backend)
    assert backend.isolated and backend.fork_server is not None
    # Each probe tries to read the first job's config (its report token).
    backend.env = {"PATH": "/usr/bin:/bin", "PROBE_READ": str(
        backend.agent_folder(mine.vmis[0]) / "agent.json")}
    await backend.create(mine)
    first = await _reported(backend, mine.vmis[0])
    await backend.create(theirs)
    second = await _reported(backend, theirs.vmis[0])

    for unit, report, config in ((mine, first, mine_config), (theirs, second, theirs_config)):
        vmi = unit.vmis[0]
        home = backend.agent_folder(vmi)
        uid = home.stat().st_uid
        assert backend._isolation.owns(uid)
        assert report["resuid"] == [uid] * 3 and report["resgid"] == [uid] * 3
        assert report["groups"] == [] and report["umask"] == 0o077
        assert report["sid"] == report["pid"] == report["pgid"] == backend.pid(vmi.name)
        assert report["cwd"] == str(home)
        assert report["env"]["HOME"] == str(home) and report["env"]["USER"] == f"cac-{uid}"
        assert "WORKER_ONLY" not in report["env"]
        assert sorted(os.listdir(f"/proc/{report['pid']}/fd")) == ["0", "1", "2"]
        # Not dumpable: its /proc files stay root's, so its job's own user (a shell)
        # cannot ptrace it or read its memory (the zygote's hash secret is there).
        assert os.stat(f"/proc/{report['pid']}/mem").st_uid == 0
        assert str(home / "agent.json") in local.cmdline(report["pid"])
        assert report["token_len"] == len(config.report_token)
    assert first["resuid"] != second["resuid"]
    assert first["read_other"] is True and second["read_other"] is False

    # The first job's report token: in its agent's memory, never in the zygote's
    # (so in no agent forked after it).
    token = mine_config.report_token.encode()
    assert _memory_holds(first["pid"], token)
    assert not _memory_holds(backend.fork_server.pid, token)
    assert not _memory_holds(second["pid"], token)
    assert await backend.stop_all() == 2
    running.scope.cancel()


async def test_a_forked_agents_exit_status_comes_from_the_fork_server(
        nursery, tmp_path, probe_forked, caplog):
    caplog.set_level(logging.INFO, "nodes.k8s_worker.local")
    backend = LocalBackend(FAST, tmp_path, env={**os.environ, "FAKE_AGENT": "fail"})
    running = await started(nursery, backend)
    unit = unit_of(agent_config(WORKER_KEY))
    await backend.create(unit)
    assert "via=fork" in caplog.text
    failed = await running.until(VmiPhase.FAILED)
    assert "exited with status 3" in failed.message
    running.scope.cancel()


async def test_when_the_fork_server_is_gone_agents_are_spawned_and_forked_ones_still_watched(
        nursery, tmp_path, probe_forked, caplog):
    caplog.set_level(logging.INFO, "nodes.k8s_worker.local")
    backend = LocalBackend(FAST, tmp_path, env={**os.environ, "FAKE_AGENT": "sleep"})
    running = await started(nursery, backend)
    forked = unit_of(agent_config(WORKER_KEY, replica=0))
    await backend.create(forked)
    await _reported(backend, forked.vmis[0])
    server = backend.fork_server
    assert server is not None and server.usable
    os.kill(server.pid, signal.SIGKILL)
    with trio.fail_after(10):
        while server.usable:  # noqa: ASYNC110 - its socket closes
            await trio.sleep(0.02)
    assert "pid" in server.problem

    spawned = unit_of(agent_config(WORKER_KEY, replica=1))
    # The default command spawned: the real agent (it finds no worker; it runs).
    await backend.create(spawned)
    assert re.search(r"local\.started vmi=\S+-r1-\S+ .* via=spawn", caplog.text)
    assert "local.fork_server_unusable" in caplog.text
    assert backend.pid(spawned.vmis[0].name) is not None

    # The agent forked before the zygote died is still watched (its status unknown now).
    os.kill(backend.pid(forked.vmis[0].name), signal.SIGKILL)
    failed = await running.until(VmiPhase.FAILED)
    assert failed.name == forked.vmis[0].name and "unknown status" in failed.message
    await backend.delete(spawned)
    running.scope.cancel()


async def test_a_forked_agent_is_adopted_after_a_worker_restart(
        nursery, tmp_path, probe_forked):
    env = {**os.environ, "FAKE_AGENT": "sleep"}
    first = await started(nursery, LocalBackend(FAST, tmp_path, env=env))
    unit = unit_of(agent_config(WORKER_KEY))
    await first.backend.create(unit)
    report = await _reported(first.backend, unit.vmis[0])
    zygote = first.backend.fork_server.pid
    first.scope.cancel()  # the worker goes, and its fork server; the agent stays
    with trio.fail_after(10):
        while _state(zygote) not in "ZX":  # noqa: ASYNC110 - a real process ends
            await trio.sleep(0.02)
    assert _state(report["pid"]) not in "ZX"
    # Found by its command line too (as if the worker died before writing process.json).
    (tmp_path / unit.vmis[0].disk / "process.json").unlink()

    second = await started(nursery, LocalBackend(FAST, tmp_path, env=env))
    await second.backend.create(unit)  # the redelivered create
    assert second.backend.pid(unit.vmis[0].name) == report["pid"]
    assert [e.phase for e in second.drain()] == [VmiPhase.RUNNING]
    await second.backend.delete(unit)
    assert _state(report["pid"]) in "ZX"
    second.scope.cancel()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


async def test_the_fork_server_refuses_hostile_requests_and_keeps_serving(tmp_path):
    server = _forkserver.ForkServer(sys.executable, (PROBE,),
                                    {"PATH": os.environ["PATH"]})
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        assert await server.wait_ready(30)
        sock = server._sock
        log_fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for garbage in (b"", b"\xff\xfe", b"[]", b'{"op":"spawn"}', b"{" * 5000,
                            json.dumps({"op": "spawn", "id": 7, "module": "os",
                                        "argv": [], "env": {}}).encode(),
                            json.dumps({"op": "spawn", "id": 8, "module": PROBE,
                                        "argv": ["x\x00"], "env": {}}).encode(),
                            json.dumps({"op": "spawn", "id": 9, "module": PROBE,
                                        "argv": [], "env": {}, "uid": 5}).encode(),
                            json.dumps({"op": "spawn", "id": 11, "module": PROBE,
                                        "argv": [], "env": {},
                                        "function": "os.system"}).encode(),
                            b"x" * (_forkserver.MAX_MESSAGE + 10), b"[" * 60000):
                if garbage:
                    await sock.sendmsg([garbage], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                    _fds(log_fd))])
            # A well-formed request without its log is refused too.
            await sock.send(json.dumps({"op": "spawn", "id": 10, "module": PROBE,
                                        "argv": [], "env": {}}).encode())
            with pytest.raises(_forkserver.ForkServerError, match="module 'os'"):
                await server.spawn("os", [], fds=[log_fd], env={})
            config = tmp_path / "agent.json"
            config.write_text(json.dumps({"report_token": "t" * 8}))
            for function in (None, "main"):  # as __main__, and its main(argv) called
                process = await server.spawn(PROBE, ["--config", str(config)], fds=[log_fd],
                                             env={"FAKE_AGENT": "fail"}, function=function)
                with trio.fail_after(20):
                    assert await process.wait() == 3
            assert (tmp_path / "log").read_text().count("probe=") == 2
            assert server.usable
        finally:
            os.close(log_fd)
            nursery.cancel_scope.cancel()


@given(st.binary(max_size=2000) | st.builds(
    lambda doc: json.dumps(doc).encode(),
    st.dictionaries(st.sampled_from(["op", "id", "module", "argv", "env", "cwd", "uid",
                                     "gid", "umask", "session", "stdio", "function"]),
                    st.none() | st.integers() | st.text(max_size=20)
                    | st.lists(st.text(max_size=5), max_size=3)
                    | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)))
    | st.just(b'{"op":"spawn","id":1,"module":"m","argv":[],"env":{}}'))
def test_a_request_is_a_spawn_request_or_a_value_error(data):
    try:
        request = _forkserver.parse_request(data, frozenset({"m"}))
    except ValueError:
        return
    assert request.module == "m" and all(isinstance(arg, str) for arg in request.argv)
    assert (request.uid is None) == (request.gid is None)
