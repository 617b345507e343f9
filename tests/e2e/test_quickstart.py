"""The README's quick start, end to end: ``cosmicac up`` as a subprocess, then
the CLI only (and the official ``openai`` package for inference): the quick start's
own lines as real processes, the other commands in this process (a process costs
its imports, about 0.7 s of CPU, and the suite's time is everyone's).

Logs in, creates an inference job on the ``local`` runtime and waits for
``running``, chats through ``openai`` with a key from ``cosmicac apikeys
create`` and finds exactly that usage in ``cosmicac apikeys usage``, creates a
container job and runs ``cosmicac shell JOB -- echo hi``, restarts both jobs,
deletes one, times one more job with bench/job_start.py (its smoke test: one
``up`` serves both), and stops ``up`` with SIGINT with no process left behind: up
itself stops the agent of the job still running (agents live in sessions of
their own, so they outlive a worker restart).

On the way it checks what ``up`` sets up for its operator: the credentials
file, the local CLI logged in at once, the operator's rights (a team and its
GPU quota), wrk-monitor behind the door only with its token, and the System
records wrk-ork and the worker ship for a job. One ``up`` serves all of it:
each start costs every daemon's start-up, and the suite's time is everyone's.

``up`` runs under umask 000 in a folder every local user may enter, and
afterwards a local user (``nobody``) tries to read what it kept there: the
identities, configs, credentials, databases, logs and outboxes must be owner-only
whatever the operator's umask.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from ..cli.helpers import UP, free_base_port, pids_using, read_until, running_up
from ..p2p.helpers import exposed_paths
from .cli import Cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

def _chat(url: str, key: str, model: str) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"{url}/inference/v1", api_key=key, timeout=60,
                           max_retries=0)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
    return answer.model_dump()


async def _usage_once_replicated(cli: Cli, key_id: str, want_total: int) -> list[dict]:
    """``apikeys usage`` once the proxy's write has reached app-node's replica."""
    rows: list[dict] = []
    with trio.move_on_after(30):
        while True:
            rows = await cli.json("apikeys", "usage", "--key", key_id)
            if sum(row["total_tokens"] for row in rows) >= want_total:
                break
            await trio.sleep(0.2)
    return rows


async def _job_start_bench_on(storage: Path) -> None:
    """bench/job_start.py attached to this up, as ``make bench`` runs the script (a
    subprocess, JSON lines on stdout): every step and mark of one job is printed,
    and the steps add up. The figures themselves are the bench's business."""
    done = await trio.run_process(
        [sys.executable, str(ROOT / "bench" / "job_start.py"), "--attach", str(storage),
         "--jobs", "1", "--warm-up", "0", "--poll-ms", "150"],
        capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = {}
    for line in done.stdout.decode().splitlines():
        record = json.loads(line)
        assert record["bench"] == "job_start", record
        figures[record["metric"]] = record["value"]
    steps = ("ork", "queue", "worker", "agent_start", "health", "api_poll")
    for step in (*steps, "api"):
        assert figures[f"step_{step}"] >= 0, step
    assert figures["step_agent_start"] > 0 and figures["step_health"] > 0
    # The steps are consecutive: they add up to the total (rounding aside).
    assert abs(sum(figures[f"step_{s}"] for s in steps) - figures["total"]) < 1.0
    assert figures["at_running"] == pytest.approx(figures["total"])
    assert "leftover_processes" not in figures  # up is not the bench's to stop here
    assert b"agent_start" in done.stderr  # the table


def _read_as_nobody(root: Path) -> list[str]:
    """What user ``nobody`` can open or list under ``root`` (a real non-root process)."""
    probe = (
        "import os, sys\n"
        "root = sys.argv[1]\n"
        "for folder, folders, files in os.walk(root, onerror=lambda e: None):\n"
        "    print('listed', folder)\n"
        "    for name in files:\n"
        "        try:\n"
        "            open(os.path.join(folder, name), 'rb').close()\n"
        "            print('read', os.path.join(folder, name))\n"
        "        except OSError:\n"
        "            pass\n")
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
         "-I", "-c", probe, str(root)], capture_output=True, check=True, timeout=60)
    return result.stdout.decode().splitlines()


@pytest.fixture
def shared_folder() -> Path:
    """A folder under /tmp that every local user may enter, as a careless /srv would be."""
    folder = Path(tempfile.mkdtemp(prefix="cosmicac-e2e-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _isolates() -> bool:
    """Does up's local backend run the agents as users of their own here: root, with
    CosmicAC readable by others and a Python others may run (the worker's or the
    system's of the same version)?"""
    from nodes.k8s_worker.local import _import_roots, _unreachable

    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    return (os.geteuid() == 0 and not any(_unreachable(root) for root in _import_roots())
            and not (_unreachable(Path(sys.executable), execute=True)
                     and _unreachable(system, execute=True)))


async def test_quickstart_through_the_cli(tmp_path: Path, shared_folder: Path) -> None:
    storage = shared_folder / "up"
    base = free_base_port()
    env = dict(os.environ, COSMICAC_CONFIG_DIR=str(tmp_path / "config"))
    env.pop("COSMICAC_SERVER", None)
    async with running_up(storage, base, env, umask=0) as process:
        with trio.fail_after(120):
            url = (await read_until(process.stdout, UP))[1]
        assert url == f"http://127.0.0.1:{base + 20}"
        creds = json.loads((storage / "credentials.json").read_text())
        assert creds["url"] == url and creds["email"] == "admin@cosmicac.local"
        cli = Cli(env)
        # up logged the local CLI in at once (its config folder is this test's).
        assert (await cli.json("whoami"))["user"]["email"] == creds["email"]
        contexts = json.loads((tmp_path / "config" / "contexts.json").read_text())
        assert contexts["contexts"][contexts["current"]]["server"] == url
        env["COSMICAC_SERVER"] = url
        await cli("login", "--email", creds["email"], "--password-stdin",
                  stdin=f"{creds['password']}\n".encode(), process=True)
        assert (await cli.json("whoami"))["user"]["email"] == creds["email"]
        # up's admin is an operator: creates teams and sets their GPU quotas.
        await cli("teams", "create", "research")
        await cli("teams", "quota", "set", "research", "--gpus", "4")

        # wrk-monitor behind the door: with its token (0600, made by up), or nothing.
        token = (storage / "wrk-monitor" / "http-token").read_text().strip()

        def monitor(path: str, token: str | None = None) -> httpx.Response:
            headers = {} if token is None else {"Authorization": f"Bearer {token}"}
            return httpx.get(f"{url}/monitor{path}", headers=headers, timeout=30)

        for path in ("/metrics", "/jobs/any-job/logs"):
            refused = await trio.to_thread.run_sync(monitor, path)
            assert refused.status_code == 401, refused.text
        metrics = await trio.to_thread.run_sync(monitor, "/metrics", token)
        assert metrics.status_code == 200 and "monitor" in metrics.text, metrics.text

        # The web UI behind the entry point: a page asks to sign in first.
        page = await trio.to_thread.run_sync(functools.partial(
            httpx.get, f"{url}/jobs", follow_redirects=True, timeout=30))
        assert page.status_code == 200 and "<h1>Sign in</h1>" in page.text, page.text
        assert str(page.url) == f"{url}/login?next=/jobs"

        # An inference job on the local runtime, served as "demo".
        chat_job = (await cli("jobs", "create", "--name", "chat", "--type", "inference",
                              "--runtime", "local", "--model", "demo", "--gpus", "1",
                              "--wait", "--timeout", "180", process=True)
                    ).stdout.decode().strip()
        assert re.fullmatch(r"\S+", chat_job), chat_job
        job = await cli.json("jobs", "get", chat_job)
        assert job["id"] == chat_job and job["status"] == "running"

        # wrk-ork and the worker ship the job's System steps to wrk-monitor, and
        # app-node reads them from it for `jobs logs`.
        shipped: set[str] = set()
        with trio.move_on_after(30):
            while not {"wrk-ork", "wrk-server-k8s-nvidia"} <= shipped:
                body = (await trio.to_thread.run_sync(
                    monitor, f"/jobs/{chat_job}/logs", token)).json()
                shipped = {r["service"] for r in body["records"] if r["source"] == "System"}
                await trio.sleep(0.2)
        assert {"wrk-ork", "wrk-server-k8s-nvidia"} <= shipped, shipped
        logs = await cli("jobs", "logs", chat_job, "-o", "json")
        records = [json.loads(line) for line in logs.stdout.splitlines()]
        assert records and all(r["job_id"] == chat_job for r in records)

        key = await cli.json("apikeys", "create", "--name", "e2e")
        answer = await trio.to_thread.run_sync(_chat, url, key["key"], "demo")
        assert answer["choices"][0]["message"]["content"]
        usage = answer["usage"]
        rows = await _usage_once_replicated(cli, key["id"], usage["total_tokens"])
        assert [(row["model"], row["prompt_tokens"], row["completion_tokens"],
                 row["total_tokens"], row["requests"]) for row in rows] == \
            [("demo", usage["prompt_tokens"], usage["completion_tokens"],
              usage["total_tokens"], 1)]

        # A container job and a shell into it.
        box_job = (await cli("jobs", "create", "--name", "box", "--type", "container",
                             "--gpus", "1", "--wait", "--timeout", "180")
                   ).stdout.decode().strip()
        said = await cli("shell", box_job, "--", "echo", "hi", process=True)
        assert said.stdout == b"hi\n", said
        # A command's exit status comes back as the shell's; as root, the same shell
        # also shows whose it is (one process for both: each costs its start).
        isolates = _isolates()
        probe = (f"id -u; cat {storage / 'app-node' / 'identity'} 2>&1; exit 7" if isolates
                 else "exit 7")
        status = await cli("shell", box_job, "--", "sh", "-c", probe, ok=False, process=True)
        assert status.returncode == 7, status
        if isolates:
            # up as root: the shell is the job's own user, not the platform's, even
            # with the tests' Python under /root (the agents run on the system's).
            uid, *rest = status.stdout.decode().splitlines()
            assert uid != "0" and "Permission denied" in " ".join(rest), status
            assert stat.S_IMODE(storage.stat().st_mode) == 0o711  # agents pass through

        for job_id in (chat_job, box_job):
            await cli("jobs", "restart", job_id, "--wait", "--timeout", "180")
            assert (await cli.json("jobs", "get", job_id))["status"] == "running"
        await cli("jobs", "delete", chat_job, "--wait", "--timeout", "120")
        gone = await cli("jobs", "get", chat_job, ok=False)
        assert gone.returncode == 1, gone
        assert [job["id"] for job in await cli.json("jobs", "list")] == [box_job]
        await _job_start_bench_on(storage)

        # What it kept, while it runs (the databases' WAL files exist now).
        assert exposed_paths(storage) == []
        assert await trio.to_thread.run_sync(_read_as_nobody, storage) == []

        # The box's agent is still running: up stops it, not the worker.
        vmis = storage / "wrk-server-k8s-nvidia" / "vmis"
        agents = [json.loads(path.read_text())["pid"] for path in vmis.glob("*/process.json")]
        assert agents and all(pid in pids_using(storage) for pid in agents)
        process.send_signal(signal.SIGINT)
        with trio.fail_after(20):
            assert await process.wait() == 0
            said = b""
            while chunk := await process.stderr.receive_some():
                said += chunk
        assert f"stopped {len(agents)} agent processes".encode() in said, said[-2000:]
        assert pids_using(storage) == []
    assert exposed_paths(storage) == []
