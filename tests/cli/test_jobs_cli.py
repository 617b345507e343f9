"""``cosmicac jobs`` (run in this process) against an in-process app-node and wrk-ork.

The test plays the worker (``served_ork.drive``) while a ``--wait`` command follows
the job's events (or polls, where app-node offers none): create waits until
running, restart until running again, delete until gone; a failed job exits 1
with its reason, a wait that times out exits 1 saying so; a lagged stream is
subscribed again. stdout holds only what scripts read (the id, the JSON document).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable

import pytest
import trio
import typer
from hypothesis import given
from hypothesis import strategies as st

from cli import _wait
from cli._wait import Goal, Outcome, judge, sse_events, summary
from cli.session import Api
from contracts.model import JobStatus
from contracts.ork import JobEvent

from ..p2p.helpers import wait_until
from .support import Ran, ServedOrk, one_error_line

pytestmark = pytest.mark.slow

IMAGE = "docker://registry.local/jobs/app:1"


async def while_running(served: ServedOrk, args: list[str],
                        worker: Callable[[], Awaitable[None]]) -> Ran:
    """Run ``cosmicac *args`` while ``worker`` plays the worker; the command's result."""
    result: list[Ran] = []

    async def run() -> None:
        result.append(await served.cli(*args))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await worker()
    return result[0]


def _status(served: ServedOrk, job: str) -> str:
    assert served.world is not None
    return served.world.status(job).value


async def test_create_wait_get_list_restart_delete(served_ork: ServedOrk) -> None:
    served = served_ork
    with trio.fail_after(120):
        await served.login()
        known = served.job_ids()

        async def start() -> None:
            served.drive(await served.new_job(known), "active")

        created = await while_running(served, [
            "jobs", "create", "--name", "llm", "--type", "inference", "--runtime", "local",
            "--model", "demo", "--image", IMAGE, "--replicas", "2", "--wait"], start)
        assert created.returncode == 0, created.stderr
        job = created.stdout.decode().strip()
        assert created.stdout.decode() == f"{job}\n"  # the id alone, for JOB=$(...)
        assert "running" in created.stderr.decode()  # progress went to stderr
        hub = served.node.services.events
        assert hub is not None and hub.subscriptions == 1  # it followed the job's events

        got = await served.cli("jobs", "get", job, "-o", "json")
        assert got.returncode == 0, got.stderr
        document = json.loads(got.stdout)
        assert document["id"] == job and document["status"] == "running"
        assert [r["status"] for r in document["replicas"]] == ["running", "running"]
        assert document["spec"]["runtime"] == "local"
        table = await served.cli("jobs", "get", job)
        assert table.returncode == 0 and job in table.stdout.decode()

        second = await served.cli("jobs", "create", "--name", "vllm", "--type", "inference",
                                  "--runtime", "vllm", "--model", "demo", "--served-name",
                                  "other", "--image", IMAGE, "--gpus", "2", "--replicas", "2",
                                  "-o", "json")
        assert second.returncode == 0, second.stderr
        other = json.loads(second.stdout)
        assert other["spec"]["gpus"] == 2 and other["spec"]["image"] == IMAGE
        listed = await served.cli("jobs", "list", "--all", "-o", "json")
        assert [j["id"] for j in json.loads(listed.stdout)] == [other["id"], job]
        assert (await served.cli("jobs", "list")).returncode == 0

        # Its replicas still start: one may be restarted, another deleted.
        again = await served.cli("jobs", "replicas", "restart", other["id"], "1")
        assert again.returncode == 0, again.stderr
        gone = await served.cli("jobs", "replicas", "delete", other["id"], "0")
        assert gone.returncode == 0, gone.stderr
        # A running replica may not (wrk-ork's 409, one line).
        running = await served.cli("jobs", "replicas", "delete", job, "1")
        assert running.returncode == 1
        one_error_line(running)

        async def come_back() -> None:
            await wait_until(lambda: _status(served, job) == "restarting", limit_s=30)
            served.drive(job, "active")

        restarted = await while_running(served, ["jobs", "restart", job, "--wait"],
                                        come_back)
        assert restarted.returncode == 0, restarted.stderr
        assert _status(served, job) == "active" and not restarted.stdout

        async def remove() -> None:
            await wait_until(lambda: _status(served, job) == "deleting", limit_s=30)
            served.drive(job, "deleted")

        deleted = await while_running(served, ["jobs", "delete", job, "--wait"], remove)
        assert deleted.returncode == 0, deleted.stderr
        assert f"deleted job {job}" in deleted.stderr.decode()
        assert hub.subscriptions == 3 and hub.subscribers == 0
        missing = await served.cli("jobs", "get", job)
        assert missing.returncode == 1 and job in one_error_line(missing)


async def test_failed_timeout_usage_login_unreachable(served_ork: ServedOrk) -> None:
    served = served_ork
    with trio.fail_after(120):
        anonymous = await served.cli("jobs", "list")
        assert anonymous.returncode == 3
        one_error_line(anonymous)
        await served.login()

        for args, needle in [
            # No --image and no default_image in this deployment: the API's 422.
            (["--name", "box", "--type", "container"], "default_image"),
            (["--name", "box", "--type", "vm", "--image", IMAGE], "--type"),
            (["--type", "container", "--image", IMAGE], "--name"),
            # The API's 422, naming the field.
            (["--name", "box", "--type", "container", "--image", IMAGE, "--replicas", "2"],
             "replicas"),
        ]:
            invalid = await served.cli("jobs", "create", *args)
            assert invalid.returncode == 2, (args, invalid.stderr)
            assert needle in one_error_line(invalid) and not invalid.stdout

        known = served.job_ids()

        async def crash() -> None:
            served.drive(await served.new_job(known), "failed", message="out of memory")

        failed = await while_running(served, [
            "jobs", "create", "--name", "box", "--type", "container", "--image", IMAGE,
            "--wait", "-o", "json"], crash)
        assert failed.returncode == 1
        assert "out of memory" in failed.stderr.decode().splitlines()[-1]
        assert not failed.stdout  # -o json --wait prints the job once it runs, never here

        slow = await served.cli("jobs", "create", "--name", "slow", "--type", "container",
                                "--image", IMAGE, "--wait", "--timeout", "0.5")
        assert slow.returncode == 1
        assert "timed out" in slow.stderr.decode().splitlines()[-1]
        assert slow.stdout.decode().strip() in served.job_ids()

        unknown = await served.cli("jobs", "get", "no-such-job")
        assert unknown.returncode == 1 and "no-such-job" in one_error_line(unknown)

        with socket.socket() as closed:  # a port nothing listens on
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
        down = await served.cli("jobs", "list", "--server", f"http://127.0.0.1:{port}")
        assert down.returncode == 4 and "cannot reach" in one_error_line(down)


async def test_wait_subscribes_again_after_lagged_and_polls_without_events(
        served_ork: ServedOrk) -> None:
    served = served_ork
    hub = served.node.services.events
    assert hub is not None
    with trio.fail_after(120):
        await served.login()
        known = served.job_ids()

        async def lag_then_start() -> None:
            job = await served.new_job(known)
            await wait_until(lambda: hub.subscribers == 1, limit_s=30)
            flood = JobEvent(job_id=job, team="t", status=JobStatus.STARTING,
                             previous=JobStatus.QUEUED, reason="", at=1.0)
            for _ in range(hub.capacity + 2):  # faster than any reader: dropped
                hub.publish(flood)
            await wait_until(lambda: hub.subscriptions == 2 and hub.subscribers == 1,
                             limit_s=30)  # it came back
            served.drive(job, "active")

        create = ["jobs", "create", "--type", "container", "--image", IMAGE, "--wait"]
        lagged = await while_running(served, [*create, "--name", "lag"], lag_then_start)
        assert lagged.returncode == 0, lagged.stderr
        assert hub.dropped == 1 and hub.subscriptions == 2

        # An app-node without event streams (here: 503): --wait polls, as before.
        served.node.services.events = None
        known = served.job_ids()

        async def start() -> None:
            served.drive(await served.new_job(known), "active")

        polled = await while_running(served, [*create, "--name", "poll"], start)
        assert polled.returncode == 0, polled.stderr
        assert "running" in polled.stderr.decode() and hub.subscriptions == 2


_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20)


@given(st.lists(st.tuples(st.from_regex(r"[a-z]{1,8}", fullmatch=True), _TEXT), max_size=6),
       st.booleans())
def test_sse_events_reads_what_app_node_writes(events: list[tuple[str, str]],
                                               comments: bool) -> None:
    wire = ""
    for event, text in events:
        wire += (": keep-alive\n\n" if comments else "") + \
            f"event: {event}\ndata: {json.dumps(text)}\n\n"
    read = [(e, json.loads(d)) for e, d in sse_events(wire.split("\n")) if e]
    assert read == events
    assert sum(1 for e, _ in sse_events(wire.split("\n")) if not e) == \
        (len(events) if comments else 0)
    # Lines split across data fields join with newlines; unknown fields are ignored.
    assert list(sse_events(["id: 1", "data: a", "data: b", "retry: 5", ""])) == [
        ("message", "a\nb")]


def test_judge_and_summary() -> None:
    job = {"id": "j", "status": "starting", "reason": "", "replicas": [
        {"index": 0, "status": "running", "message": ""},
        {"index": 1, "status": "failed", "message": "no GPU"}]}
    assert summary(job) == "starting · replica 0 running · replica 1 failed (no GPU)"
    assert judge(job, Goal.RUNNING) == (Outcome.WAIT, "")
    assert judge({**job, "status": "failed"}, Goal.RUNNING) == (
        Outcome.FAILED, "job j failed: replica 1: no GPU")
    assert judge({**job, "status": "running"}, Goal.RUNNING)[0] is Outcome.DONE
    assert judge(None, Goal.RUNNING)[0] is Outcome.FAILED
    assert judge({**job, "status": "deleting"}, Goal.GONE)[0] is Outcome.WAIT
    assert judge(None, Goal.GONE)[0] is Outcome.DONE


def _replay(monkeypatch: pytest.MonkeyPatch, documents: list[dict | None]) -> None:
    """The poller answers ``documents`` in turn (the last one forever)."""
    answers = iter(documents)
    last: list[dict | None] = [None]

    def get(self: _wait._Poller) -> dict | None:
        last[0] = next(answers, last[0])
        return last[0]

    monkeypatch.setattr(_wait._Poller, "get", get)


@pytest.mark.parametrize("tty", [False, True])
def test_wait_for_shows_changes_and_times_out(monkeypatch: pytest.MonkeyPatch, capsys,
                                              tty: bool) -> None:
    now = [0.0]
    starting = {"id": "j", "status": "starting", "reason": "", "replicas": [
        {"index": 0, "status": "starting", "message": "pulling"}]}
    running = {**starting, "status": "running",
               "replicas": [{"index": 0, "status": "running", "message": ""}]}
    api = Api("http://127.0.0.1:9", "t")
    fake = {"tty": tty, "clock": lambda: now[0],
            "sleep": lambda s: now.__setitem__(0, now[0] + s)}

    _replay(monkeypatch, [starting, starting, running])
    assert _wait.wait_for(api, "j", Goal.RUNNING, 60, **fake) == running
    if not tty:
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2 and "pulling" in lines[0] and "running" in lines[1]

    _replay(monkeypatch, [starting])
    with pytest.raises(typer.Exit) as exited:
        _wait.wait_for(api, "j", Goal.RUNNING, 5, **fake)
    assert exited.value.exit_code == 1
    assert "timed out after 5s" in capsys.readouterr().err


async def test_create_takes_the_model_servers_arguments_and_environment(
        served_ork: ServedOrk) -> None:
    served = served_ork
    with trio.fail_after(60):
        await served.login()
        tuned = await served.cli("jobs", "create", "--name", "tuned", "--type", "inference",
                                 "--runtime", "vllm", "--model", "demo", "--served-name",
                                 "tuned", "--image", IMAGE, "--server-args",
                                 "--max-model-len 4096", "--server-env", "OMP_NUM_THREADS=2",
                                 "-o", "json")
        assert tuned.returncode == 0, tuned.stderr
        assert json.loads(tuned.stdout)["spec"]["runtime_settings"] == {
            "args": ["--max-model-len", "4096"], "env": {"OMP_NUM_THREADS": "2"}}
        refused = await served.cli("jobs", "create", "--name", "x", "--type", "inference",
                                   "--runtime", "vllm", "--model", "demo", "--image", IMAGE,
                                   "--server-env", "HF_ENDPOINT=https://evil.example")
        assert refused.returncode == 2 and b"runtime_settings.env" in refused.stderr


async def test_wireguard_writes_this_clis_config_for_an_isolated_jobs_network(
        served_ork: ServedOrk, tmp_path) -> None:
    from contracts.gateway import GatewayView
    from p2p.keys import load_keypair
    from runtime.wireguard import parse_config, wg_key

    served = served_ork
    assert served.world is not None
    served.world.report = served.world.report.model_copy(update={"isolated_networks": True})
    served.world.hear()
    with trio.fail_after(60):
        await served.login()
        created = await served.cli("jobs", "create", "--name", "private", "--type",
                                   "container", "--image", IMAGE, "--isolated-network",
                                   "-o", "json")
        assert created.returncode == 0, created.stderr
        job = json.loads(created.stdout)["id"]
        early = await served.cli("jobs", "wireguard", job)
        assert early.returncode == 1 and "not up yet" in one_error_line(early)
        served.drive(job, "active", gateway=GatewayView(
            public_key=wg_key(b"\x05" * 32), endpoint="gw.example.net:30001",
            tunnel_subnet="10.250.0.0/24", networks=("10.88.0.0/24",)))
        out = tmp_path / "cac0.conf"
        wrote = await served.cli("jobs", "wireguard", job, "-O", str(out))
        assert wrote.returncode == 0, wrote.stderr
        assert out.stat().st_mode & 0o777 == 0o600  # it holds the private key
        me = load_keypair(served.config / "user")
        (_, interface), (_, peer) = parse_config(out.read_text())
        assert interface["PrivateKey"] == wg_key(me.x25519_private)
        assert interface["Address"].startswith("10.250.0.")
        assert (peer["Endpoint"], peer["AllowedIPs"]) == ("gw.example.net:30001",
                                                          "10.88.0.0/24")
        printed = await served.cli("jobs", "wireguard", job)
        assert printed.stdout.decode() == out.read_text()
