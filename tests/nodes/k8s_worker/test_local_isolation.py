"""The local backend's isolation (issue 21, defect 4): a container job's shell is not
a shell of the platform's user.

The real test starts real agents through the backend, as root (the tests run as
root here; skipped otherwise), each as a uid of its own, and opens a shell as the
team's key: it cannot read a daemon's identity, the worker's files, nor another
job's agent, and nothing it leaves behind outlives the job. The agents run on the
system's Python 3.11 with this checkout on PYTHONPATH, because the interpreter
of the tests' venv lives under /root (0700), where no other user may go: which
is exactly what ``isolation=auto`` detects and warns about.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from agents.instance import open_shell
from contracts.model import JobSpec
from nodes.k8s_worker.agents import AgentEventKind
from nodes.k8s_worker.backend import BackendError, ReplicaUnit, VmiPhase
from nodes.k8s_worker.local import LocalBackend, LocalClusterSettings, _unreachable
from p2p.connection import dial_tcp
from p2p.keys import KeyPair, load_or_create_keypair
from tests.agents.helpers import agent_config, running_worker, vmi_of

ROOT = Path(__file__).resolve().parents[3]
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
SPEC = JobSpec(name="t", team="team", type="container", image="docker://registry.local/img:1",
               gpus=1)

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="starting agents as other users "
                             "needs root")


def unit_of(config) -> ReplicaUnit:
    return ReplicaUnit(job_id=config.job_id, replica=config.replica,
                       generation=config.generation, spec=SPEC, vmis=(vmi_of(config),))


@pytest.fixture
def deployment():
    """A deployment folder others may pass (0711), with a daemon's storage (0700)
    holding its identity, and the agents' folder: as ``cosmicac up`` lays them out."""
    folder = Path(tempfile.mkdtemp(prefix="cosmicac-isolation-", dir="/tmp"))
    folder.chmod(0o711)
    app_node = folder / "app-node"
    load_or_create_keypair(app_node)
    app_node.chmod(0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _agent_command() -> tuple[list[str], dict[str, str]]:
    if not SYSTEM_PYTHON.exists() or _unreachable(SYSTEM_PYTHON, execute=True):
        pytest.skip(f"no {SYSTEM_PYTHON} others may run")
    site = next(p for p in sys.path if p.endswith("site-packages") and ".venv" in p)
    for path in (ROOT, Path(site)):
        if _unreachable(path):
            pytest.skip(f"{path} is not readable by other users")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{site}",
           "PYTHONDONTWRITEBYTECODE": "1"}
    return [str(SYSTEM_PYTHON), "-m", "cli.main", "agent", "run"], env


async def _shell(nursery, backend: LocalBackend, vmi, user: KeyPair, script: str) -> str:
    """Run ``script`` in a shell of ``vmi``'s agent as ``user``; its output."""
    log = (backend.folder(vmi) / "agent.log").read_text()
    started = re.search(r"agent\.started .* key=([0-9a-f]{64}) address=([\d.]+):(\d+)", log)
    assert started, log
    with trio.fail_after(20):
        connection = await dial_tcp(started[2], int(started[3]), user,
                                    bytes.fromhex(started[1]))
        await nursery.start(connection.run)
        session = await open_shell(connection, argv=["sh", "-c", "exec 2>&1; " + script])
        output = b"".join([event.data async for event in session])
        await session.wait_exit()
        await connection.aclose()
    return output.decode()


@as_root
async def test_a_shell_is_its_jobs_own_user_and_reaches_no_daemons_storage(
        nursery, tmp_path, deployment):
    command, env = _agent_command()
    team, other_team = KeyPair.generate(), KeyPair.generate()
    agents = deployment / "agents"
    settings = LocalClusterSettings(stop_grace_s=2.0, poll_interval_s=0.05,
                                    isolation="require", agents_dir=agents)
    backend = LocalBackend(settings, tmp_path / "vmis", command, env=env)
    send, events = trio.open_memory_channel(64)
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await backend.run(send, task_status=task_status)

    async with running_worker(nursery) as worker:
        await nursery.start(run)
        assert backend.isolated and backend.isolation_problem is None
        configs = [agent_config(worker.keypair.public_key, address=worker.address,
                                job_id=job).model_copy(update={"authorized_keys": (key.hex,)})
                   for job, key in (("j-mine", team), ("j-theirs", other_team))]
        units = [unit_of(config) for config in configs]
        for unit in units:
            worker.registry.expect(unit.vmis[0])
            await backend.create(unit)
        hellos = set()
        while len(hellos) < 2:
            event = await worker.next_event()
            if event.kind is AgentEventKind.READY:
                hellos.add(event.vmi_name)
        mine, theirs = (unit.vmis[0] for unit in units)
        home, their_home = backend.agent_folder(mine), backend.agent_folder(theirs)
        uid = home.stat().st_uid
        assert settings.agent_uid_base <= uid < settings.agent_uid_base + settings.agent_uid_count
        assert their_home.stat().st_uid not in (uid, 0)  # a user per VMI
        for path, mode in ((home, 0o700), (home / "storage", 0o700),
                           (home / "agent.json", 0o600), (agents, 0o711)):
            assert stat.S_IMODE(path.stat().st_mode) == mode, path

        out = await _shell(nursery, backend, mine, team, "; ".join([
            "id -u", "id -G", "echo HOME=$HOME",
            f"cat {deployment / 'app-node' / 'identity'}",
            f"cat {backend.folder(mine) / 'agent.log'}",
            f"cat {their_home / 'agent.json'}",
            f"ls {agents}",
            f"grep -c j-mine {home / 'agent.json'}",
            "setsid sleep 300 < /dev/null > /dev/null 2>&1 &"]))
        lines = out.splitlines()
        assert lines[0] == str(uid) and lines[1] == str(uid), out  # no other group
        assert lines[2] == f"HOME={home}"
        assert out.count("Permission denied") == 4, out
        assert lines[-1] == "1", out  # its own config is its own
        assert "j-theirs" not in out and "secret" not in out.lower()

        leftovers = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.stat(f"/proc/{pid}").st_uid == uid:
                        leftovers.append(int(pid))
                except OSError:
                    continue
        assert leftovers  # the agent, and the sleep its shell left in a session of its own
        for unit in units:
            await backend.delete(unit)
        for pid in leftovers:  # the job's end took everything of its user with it
            assert _ended(pid)
        assert not home.exists() and not backend.folder(mine).exists()
        scope.cancel()
    while True:
        try:
            if events.receive_nowait().phase is VmiPhase.FAILED:
                raise AssertionError("an agent failed")
        except trio.WouldBlock:
            break


def _ended(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# -- when it cannot isolate ----------------------------------------------------------------


@as_root
async def test_an_agent_no_other_user_can_run_is_refused_or_warned_about(tmp_path, caplog):
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    program = hidden / "agent"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    send, _events = trio.open_memory_channel(8)
    required = LocalBackend(LocalClusterSettings(isolation="require"), tmp_path / "vmis",
                            [str(program)])
    with pytest.raises(BackendError) as info:
        await required.run(send)
    assert "not reachable by another user" in str(info.value) and not info.value.retryable
    caplog.set_level(logging.WARNING, logger="nodes.k8s_worker.local")
    auto = LocalBackend(LocalClusterSettings(), tmp_path / "vmis", [str(program)])
    async with trio.open_nursery() as nursery:
        await nursery.start(auto.run, send)
        assert not auto.isolated and "not reachable" in auto.isolation_problem
        nursery.cancel_scope.cancel()
    (line,) = [r.getMessage() for r in caplog.records if "local.not_isolated" in r.message]
    assert "every daemon's storage" in line


@pytest.mark.parametrize(("outer", "inner", "reachable"), [
    (0o755, 0o755, True),
    (0o711, 0o711, True),    # passing is enough, listing is not needed
    (0o700, 0o755, False),   # a folder on the way others cannot pass
    (0o755, 0o700, False),   # the folder itself
    (0o710, 0o755, False),   # group only: the agents have no group of the platform's
])
def test_a_folder_is_reachable_by_others_only_through_o_x_folders(outer, inner, reachable):
    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        base.chmod(0o711)
        (base / "a" / "b").mkdir(parents=True)
        (base / "a").chmod(outer)
        (base / "a" / "b").chmod(inner)
        assert (_unreachable(base / "a" / "b") is None) is reachable
    finally:
        shutil.rmtree(base)


async def test_every_folder_and_file_of_a_vmi_is_private_whatever_the_umask(nursery, tmp_path):
    """Issue 21, defect 9: the agent's config holds its report token, its storage its
    identity; with a umask of 0 they are still the owner's only."""
    fake = [sys.executable, str(Path(__file__).with_name("fake_agent.py"))]
    settings = LocalClusterSettings(stop_grace_s=0.5, poll_interval_s=0.05, isolation="off",
                                    agents_dir=tmp_path / "agents")
    old = os.umask(0)
    try:
        for agents_dir in (None, tmp_path / "agents"):
            state = tmp_path / f"vmis-{agents_dir is None}"
            backend = LocalBackend(settings.model_copy(update={"agents_dir": agents_dir}),
                                   state, fake, env={**os.environ, "FAKE_AGENT": "sleep"})
            send, _events = trio.open_memory_channel(64)
            scope = trio.CancelScope()

            async def run(task_status=trio.TASK_STATUS_IGNORED, backend=backend, send=send,
                          scope=scope):
                with scope:
                    await backend.run(send, task_status=task_status)

            await nursery.start(run)
            unit = unit_of(agent_config(b"\x01" * 32))
            await backend.create(unit)
            vmi = unit.vmis[0]
            home = backend.agent_folder(vmi)
            paths = [state, backend.folder(vmi), home, home / "storage",
                     home / "agent.json", backend.folder(vmi) / "agent.log",
                     backend.folder(vmi) / "process.json"]
            modes = {str(p): stat.S_IMODE(p.stat().st_mode) for p in paths}
            assert all(mode & 0o077 == 0 for mode in modes.values()), modes
            await backend.delete(unit)
            scope.cancel()
    finally:
        os.umask(old)


@as_root
async def test_a_process_of_another_user_naming_a_vmis_config_is_not_adopted(tmp_path):
    """Anyone can put a VMI's config path in a command line (a shell of another job):
    only a process of the worker's user or of the VMI's own is taken for its agent."""
    backend = LocalBackend(LocalClusterSettings(isolation="off"), tmp_path / "vmis")
    vmi = vmi_of(agent_config(b"\x01" * 32))
    home = backend.agent_folder(vmi)
    home.mkdir(parents=True)
    config = home / "agent.json"
    config.write_text(vmi.agent.to_json())
    backend.folder(vmi).mkdir(exist_ok=True)  # the worker's, holding the agent's
    argv = ["sh", "-c", "sleep 30; :", "sh", "--config", str(config)]
    stranger = await trio.lowlevel.open_process(argv, user=1_900_999_999, group=1_900_999_999,
                                                extra_groups=[])
    try:
        await trio.sleep(0.2)  # started: its command line names the config
        assert backend._record_in(backend.folder(vmi)) is None
        ours = await trio.lowlevel.open_process(argv)
        try:
            with trio.fail_after(5):
                while (found := backend._record_in(backend.folder(vmi))) is None:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            assert found.pid == ours.pid
        finally:
            ours.kill()
            await ours.wait()
    finally:
        stranger.kill()
        await stranger.wait()


async def test_a_vmi_folder_of_the_old_layout_keeps_its_storage_on_restart(nursery, tmp_path):
    """Before issue 21 the agent's config and storage were in the worker's VMI folder:
    a restart moves the storage (its identity) into the agent's own folder."""
    fake = [sys.executable, str(Path(__file__).with_name("fake_agent.py"))]
    backend = LocalBackend(LocalClusterSettings(stop_grace_s=0.5, poll_interval_s=0.05,
                                                isolation="off"), tmp_path / "vmis", fake,
                           env={**os.environ, "FAKE_AGENT": "sleep"})
    unit = unit_of(agent_config(b"\x01" * 32))
    old = backend.folder(unit.vmis[0])
    (old / "storage").mkdir(parents=True)
    (old / "storage" / "first-boot").write_text("kept")
    (old / "agent.json").write_text(unit.vmis[0].agent.to_json())
    send, _events = trio.open_memory_channel(64)
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await backend.run(send, task_status=task_status)

    await nursery.start(run)
    await backend.restart(unit)
    home = backend.agent_folder(unit.vmis[0])
    assert (home / "storage" / "first-boot").read_text() == "kept"
    assert not (old / "storage").exists() and not (old / "agent.json").exists()
    await backend.delete(unit)
    scope.cancel()
