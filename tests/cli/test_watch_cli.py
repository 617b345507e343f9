"""``jobs list --watch`` and ``jobs get --watch`` against an in-process app-node and
wrk-ork (the test plays the worker): every change shows once, from the event
streams (no polling), as rows through a pipe, redrawn in place on a terminal."""

from __future__ import annotations

import io
import json
import signal
import subprocess

import httpx
import pytest
import trio

from cli._watch import JobTable, Screen

from ..p2p.helpers import wait_until
from .support import COSMICAC, EMAIL, PASSWORD, Ran, ServedOrk, shared_tls

pytestmark = pytest.mark.slow

IMAGE = "docker://registry.local/jobs/app:1"


def _job(job_id: str, created: float, status: str = "queued") -> dict:
    return {"id": job_id, "created_at": created, "status": status}


def test_the_table_keeps_jobs_newest_first_and_knows_what_changed():
    table = JobTable()
    table.reset([_job("a", 1.0), _job("b", 2.0)])
    assert [j["id"] for j in table.ordered()] == ["b", "a"]
    assert table.put(_job("c", 3.0)) and not table.put(_job("c", 3.0))
    assert table.put(_job("a", 1.0, "running"))
    assert [j["id"] for j in table.ordered()] == ["c", "b", "a"]
    assert table.remove("b")["id"] == "b" and table.remove("b") is None


def test_a_screen_redraws_over_what_it_drew(monkeypatch):
    monkeypatch.setenv("LINES", "10")
    stream = io.StringIO()
    screen = Screen(stream)
    screen.draw(["ID  STATUS", "j-1  Queued"])
    screen.draw(["ID  STATUS", "j-1  Active", "j-2  Queued"])
    first, second = stream.getvalue().split("\x1b[2F")
    assert first == "\x1b[JID  STATUS\nj-1  Queued\n"
    assert second == "\x1b[JID  STATUS\nj-1  Active\nj-2  Queued\n"
    # taller than the window: a screenful, then how many are left out
    screen.draw([f"line {i}" for i in range(30)])
    assert stream.getvalue().endswith("line 7\n… 22 more (a taller window shows them)\n")


def _hub(served: ServedOrk):
    hub = served.node.services.events
    assert hub is not None
    return hub


async def _create(served: ServedOrk, name: str) -> str:
    created = await served.cli("jobs", "create", "--image", IMAGE, "--type", "container",
                               "--name", name)
    assert created.returncode == 0, created.stderr
    return created.stdout.decode().strip()


async def _delete(served: ServedOrk, job: str) -> None:
    """Delete over the API (one in-process command at a time: the watch is one)."""
    async with httpx.AsyncClient(base_url=f"{served.server}/api", timeout=30,
                                 verify=shared_tls()) as api:
        login = await api.post("/auth/login", json={"email": EMAIL, "password": PASSWORD})
        token = login.json()["token"]
        answer = await api.delete(f"/jobs/{job}", headers={"authorization": f"Bearer {token}"})
        assert answer.is_success, answer.text


def _status(served: ServedOrk, job: str) -> str:
    assert served.world is not None
    return served.world.status(job).value


async def _watch_a_job_through_its_life(served: ServedOrk, *options: str) -> tuple[str, Ran]:
    """``jobs get JOB --watch *options`` while the job runs, is deleted and goes."""
    await served.login()
    job = await _create(served, "watched")
    hub = _hub(served)
    result = []

    async def watch() -> None:
        result.append(await served.cli("jobs", "get", job, "--watch", *options))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await wait_until(lambda: hub.subscribers == 1, limit_s=30)
        served.drive(job, "active")
        await wait_until(lambda: _status(served, job) == "active", limit_s=30)
        await _delete(served, job)
        await wait_until(lambda: _status(served, job) == "deleting", limit_s=30)
        served.drive(job, "deleted")
    assert hub.subscribers == 0
    return job, result[0]


async def test_get_watch_shows_each_change_until_the_job_is_gone(served_ork: ServedOrk):
    with trio.fail_after(120):
        job, watched = await _watch_a_job_through_its_life(served_ork)
    assert watched.returncode == 0, watched.stderr
    assert f"job {job} is gone" in watched.stderr.decode()
    lines = watched.stdout.decode().splitlines()
    # the job's tables first, then one row per change: no change twice
    assert lines[0].split()[:4] == ["ID", "NAME", "TYPE", "STATUS"]
    changes = [line.split()[3] for line in lines if line.startswith(job)][1:]
    assert changes[-2:] == ["Deleting", "Deleted"] and "Active" in changes
    assert len(changes) == len(set(changes)), changes


async def test_get_watch_with_json_prints_a_document_per_change(served_ork: ServedOrk):
    with trio.fail_after(120):
        job, watched = await _watch_a_job_through_its_life(served_ork, "-o", "json")
    assert watched.returncode == 0, watched.stderr
    documents = [json.loads(line) for line in watched.stdout.decode().splitlines()]
    assert documents[0]["id"] == job and documents[-1]["status"] == "deleted"
    assert "running" in [d["status"] for d in documents]


async def test_list_watch_through_a_pipe_prints_a_row_per_change(served_ork: ServedOrk):
    """A real process (Ctrl-C is what ends it): the first table, then rows."""
    served = served_ork
    with trio.fail_after(120):
        await served.login()
        first = await _create(served, "first")
        hub = _hub(served)
        process = await trio.lowlevel.open_process(
            [*COSMICAC, "jobs", "list", "--watch"], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=served.env)
        chunks: dict[str, list[bytes]] = {"out": [], "err": []}

        async def drain(name: str, stream) -> None:
            while chunk := await stream.receive_some():
                chunks[name].append(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, "out", process.stdout)
            nursery.start_soon(drain, "err", process.stderr)
            try:
                await wait_until(lambda: hub.subscribers == 1, limit_s=60)
                # The first table is listed once the stream is ready: a job created
                # before it is listed would be in it, and its row never printed.
                await wait_until(lambda: first.encode() in b"".join(chunks["out"]),
                                 limit_s=60, step_s=0.05)
                second = await _create(served, "second")
                served.drive(first, "active")
                await wait_until(lambda: _status(served, first) == "active", limit_s=30)

                def printed() -> bool:  # the rows reached the pipe
                    rows = [line.split() for line in
                            b"".join(chunks["out"]).decode().splitlines()[2:]]
                    return (any(row[:1] == [second] for row in rows)
                            and any(row[:1] == [first] and row[3:4] == ["Active"]
                                    for row in rows))

                await wait_until(printed, limit_s=30, step_s=0.05)
                await trio.sleep(1)  # time for a change printed twice to show (none may)
            finally:
                process.send_signal(signal.SIGINT)
                await process.wait()
        out, err = (b"".join(chunks[name]) for name in ("out", "err"))
        assert process.returncode == 130, err
        lines = out.decode().splitlines()
        assert lines[0].split()[:4] == ["ID", "NAME", "TYPE", "STATUS"]
        assert lines[1].startswith(first), lines  # the table as it was
        rows = [(line.split()[0], line.split()[3]) for line in lines[2:]]
        # then a row per change (a row is the job as it is when the change is read:
        # the new job's creating/queued/starting may show as one Starting row)
        assert rows[0][0] == second and (first, "Active") in rows, rows
        assert len(rows) == len(set(rows)), "no change twice"
        assert not any("\x1b" in line for line in lines)
