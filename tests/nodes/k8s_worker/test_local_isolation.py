"""The local backend's isolation: a container job's shell is not
a shell of the platform's user.

The real test lays out a deployment as ``cosmicac up`` does and starts real
agents through the backend with its default agent command, as root (the tests
run as root here; skipped otherwise), each as a uid of its own, and opens a shell
as the team's key: it cannot read a daemon's identity, the worker's files, nor
another job's agent, and nothing it leaves behind outlives the job. The tests'
interpreter lives under ``/root`` (0700) here, where no other user may go: the
backend then runs the agents on the system's Python of the same version, which
is what the tests below check it picks, and when.
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
from cli.up import APP, WORKER, local_backend
from contracts.model import JobSpec
from nodes.k8s_worker import local
from nodes.k8s_worker.agents import AgentEventKind
from nodes.k8s_worker.backend import BackendError, ReplicaUnit, VmiPhase
from nodes.k8s_worker.local import (
    LocalBackend,
    LocalClusterSettings,
    _AgentPython,
    _import_roots,
    _unreachable,
)
from p2p.connection import dial_tcp
from p2p.keys import KeyPair, load_or_create_keypair
from tests.agents.helpers import agent_config, running_worker, vmi_of

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
SYSTEM_PYTHON = Path(f"/usr/bin/python{VERSION}")
SPEC = JobSpec(name="t", team="team", type="container", image="docker://registry.local/img:1",
               gpus=1)

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="starting agents as other users "
                             "needs root")


def unit_of(config) -> ReplicaUnit:
    return ReplicaUnit(job_id=config.job_id, replica=config.replica,
                       generation=config.generation, spec=SPEC, vmis=(vmi_of(config),))


@pytest.fixture
def deployment():
    """A deployment folder as ``cosmicac up`` lays it out: others may pass it (0711),
    a daemon's storage (0700) holds its identity, the worker's is 0700."""
    folder = Path(tempfile.mkdtemp(prefix="cosmicac-isolation-", dir="/tmp"))
    folder.chmod(0o711)
    load_or_create_keypair(folder / APP)
    (folder / APP).chmod(0o700)
    (folder / WORKER).mkdir(mode=0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _needs_reachable_code() -> None:
    """Skip where no other user could run CosmicAC whatever the interpreter."""
    for root in _import_roots():
        if _unreachable(root):
            pytest.skip(f"{root} is not reachable by other users")


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
        nursery, deployment):
    _needs_reachable_code()
    team, other_team = KeyPair.generate(), KeyPair.generate()
    # The worker's settings as `up` writes them, its default agent command and
    # environment: what `cosmicac up` run as root starts.
    settings = LocalClusterSettings.model_validate(
        {**local_backend(deployment)["local"], "stop_grace_s": 2.0, "poll_interval_s": 0.05,
         "isolation": "require"})
    agents = settings.agents_dir
    backend = LocalBackend(settings, deployment / WORKER / "vmis")
    send, events = trio.open_memory_channel(64)
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await backend.run(send, task_status=task_status)

    async with running_worker(nursery) as worker:
        try:
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
            base, count = settings.agent_uid_base, settings.agent_uid_count
            assert base <= uid < base + count
            assert their_home.stat().st_uid not in (uid, 0)  # a user per VMI
            for path, mode in ((home, 0o700), (home / "storage", 0o700),
                               (home / "agent.json", 0o600), (agents, 0o711)):
                assert stat.S_IMODE(path.stat().st_mode) == mode, path

            if _unreachable(Path(sys.executable), execute=True):  # a Python under /root
                assert backend.agent_python is not None
            python = await trio.to_thread.run_sync(os.path.realpath,
                                                   backend.agent_python or sys.executable)
            assert os.readlink(f"/proc/{backend.pid(mine.name)}/exe") == python
            out = await _shell(nursery, backend, mine, team, "; ".join([
                "id -u", "id -G", "echo HOME=$HOME",
                # What the agent starts with its own interpreter (the model server),
                # with the agent's environment (as a shell has it), runs as the job.
                f"{python} -c 'import agents.inference.server, sys, os; "
                "print(sys.executable, os.getuid())'",
                f"cat {deployment / 'app-node' / 'identity'}",
                f"cat {backend.folder(mine) / 'agent.log'}",
                f"cat {their_home / 'agent.json'}",
                f"ls {agents}",
                f"grep -c j-mine {home / 'agent.json'}",
                "setsid sleep 300 < /dev/null > /dev/null 2>&1 &"]))
            lines = out.splitlines()
            assert lines[0] == str(uid) and lines[1] == str(uid), out  # no other group
            assert lines[2] == f"HOME={home}"
            assert lines[3].split() == [python, str(uid)], out
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
        finally:  # a failed assert leaves no agent running
            with trio.CancelScope(shield=True):
                await backend.stop_all()
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


# -- which Python the agents run on --------------------------------------------------------


def _script(folder: Path, name: str, body: str, mode: int = 0o755) -> Path:
    folder.mkdir(mode=mode, exist_ok=True)
    folder.chmod(mode)
    program = folder / name
    program.write_text(f"#!/bin/sh\n{body}\n")
    program.chmod(0o755)
    return program


@pytest.fixture
def pythons(deployment):
    """Interpreters as a host may have them: the worker's own under a folder no other
    user may pass (as /root's), one that is not this Python's version, one missing,
    and the system's."""
    if not SYSTEM_PYTHON.exists() or _unreachable(SYSTEM_PYTHON, execute=True):
        pytest.skip(f"no {SYSTEM_PYTHON} others may run")
    _needs_reachable_code()
    name = f"python{VERSION}"
    return {
        "hidden": _script(deployment / "root", name, f'exec {SYSTEM_PYTHON} "$@"', 0o700),
        "old": _script(deployment / "old", name, 'echo "3.1"'),
        "missing": deployment / "nowhere" / name,
        "system": SYSTEM_PYTHON,
    }


def _backend(deployment, monkeypatch, pythons, candidates, **settings) -> LocalBackend:
    """A backend whose default agent command's interpreter is ``pythons["hidden"]``,
    looking for another among ``candidates``."""
    default = (str(pythons["hidden"]), "-m", "cli.main", "agent", "run")
    monkeypatch.setattr(local, "DEFAULT_AGENT_COMMAND", default)
    monkeypatch.setattr(local, "_python_candidates",
                        lambda: [str(pythons[name]) for name in candidates])
    return LocalBackend(LocalClusterSettings(agents_dir=deployment / "agents", **settings),
                        deployment / WORKER / "vmis", default)


@as_root
@pytest.mark.parametrize(("candidates", "chosen", "problems"), [
    (("missing", "old", "hidden", "system"), "system", ()),
    (("system", "old"), "system", ()),
    (("missing",), None, ("none of", "exists")),
    (("old", "hidden"), None, (f"is not Python {VERSION} (3.1)", "others cannot pass")),
])
def test_agents_run_on_a_python_others_can_run_when_the_workers_is_not(
        deployment, monkeypatch, caplog, pythons, candidates, chosen, problems):
    caplog.set_level(logging.INFO, logger="nodes.k8s_worker.local")
    backend = _backend(deployment, monkeypatch, pythons, candidates)
    backend._decide_isolation()
    if chosen is not None:
        assert backend.agent_python == str(pythons[chosen])
        assert backend.isolated and backend.isolation_problem is None
        (line,) = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("local.agent_python")]
        assert f"python={pythons[chosen]}" in line and "not reachable by another user" in line
        for root in _import_roots():
            assert str(root) in line  # on its PYTHONPATH
        return
    assert backend.agent_python is None and not backend.isolated
    assert "not reachable by another user" in backend.isolation_problem
    for problem in problems:
        assert problem in backend.isolation_problem
    assert "local.agent_python" in backend.isolation_problem  # what to set
    assert any("local.not_isolated" in r.getMessage() for r in caplog.records)
    required = _backend(deployment, monkeypatch, pythons, candidates, isolation="require")
    with pytest.raises(BackendError, match="not reachable by another user"):
        required._decide_isolation()


@as_root
def test_the_workers_own_python_is_kept_when_others_can_run_it(deployment, monkeypatch,
                                                               pythons):
    pythons["hidden"] = _script(deployment / "open", f"python{VERSION}",
                                f'exec {SYSTEM_PYTHON} "$@"')
    backend = _backend(deployment, monkeypatch, pythons, ("system",))
    backend._decide_isolation()
    assert backend.isolated and backend.agent_python is None
    off = _backend(deployment, monkeypatch, pythons, ("system",), isolation="off")
    off._decide_isolation()  # not isolating: nothing to look for
    assert not off.isolated and off.agent_python is None


@as_root
def test_local_agent_python_is_used_as_told_or_refused(deployment, monkeypatch, pythons):
    told = _backend(deployment, monkeypatch, pythons, (), agent_python=pythons["system"])
    told._decide_isolation()
    assert told.agent_python == str(pythons["system"]) and told.isolated
    for bad, why in (("old", f"is not Python {VERSION}"), ("hidden", "others cannot pass"),
                     ("missing", "No such file")):
        refused = _backend(deployment, monkeypatch, pythons, ("system",),
                           agent_python=pythons[bad])
        with pytest.raises(BackendError) as info:
            refused._decide_isolation()
        assert "local.agent_python cannot run the agent" in str(info.value)
        assert why in str(info.value) and not info.value.retryable


def test_another_pythons_environment_names_only_its_own_places():
    env = _AgentPython("/usr/bin/python3", (Path("/code"), Path("/venv/site-packages")))
    out = env.environment({"PATH": "/usr/bin", "PYTHONHOME": "/root/.pyenv",
                           "PYTHONPATH": "/root/lib", "PYTHONUNBUFFERED": "1", "LANG": "C"})
    assert out == {"PATH": "/usr/bin", "PYTHONUNBUFFERED": "1", "LANG": "C",
                   "PYTHONPATH": "/code:/venv/site-packages", "PYTHONDONTWRITEBYTECODE": "1",
                   "PYTHONNOUSERSITE": "1"}


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
    """Regression: the agent's config holds its report token, its storage its
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


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


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
        with trio.fail_after(5):  # started: its command line names the config
            while str(config).encode() not in _cmdline(stranger.pid):  # noqa: ASYNC110
                await trio.sleep(0.01)
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
    """The agent's config and storage were once in the worker's VMI folder:
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


def test_an_agent_network_namespace_that_is_not_there_stops_the_worker(tmp_path):
    """``local.agent_netns`` names a namespace each agent enters (a cluster network of
    its own); a wrong name, or a worker that is not root, is a configuration error at
    start, not a failure of every job later."""
    backend = LocalBackend(LocalClusterSettings(agent_netns="cac-no-such-netns"), tmp_path)
    with pytest.raises(BackendError, match="agent_netns") as info:
        backend._decide_isolation()
    assert not info.value.retryable
    why = "needs the worker to run as root" if os.geteuid() else "no network namespace"
    assert why in str(info.value)


def test_an_agent_network_namespace_name_is_checked():
    with pytest.raises(ValueError):
        LocalClusterSettings(agent_netns="../etc")
