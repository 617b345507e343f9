"""The supervisor behind ``cosmicac up`` with plain ``sh`` children: start order
and readiness, restarts with backoff, and a stop that leaves no process behind."""

from __future__ import annotations

import os

import pytest
import trio

from cli._supervisor import ServiceSpec, ServiceState, StartFailed, Supervisor

from ..p2p.helpers import wait_until


def sh(name: str, script: str, *, ready: str | None = None,
       depends_on: tuple[str, ...] = (), outlives_dependants: bool = False) -> ServiceSpec:
    return ServiceSpec(name=name, argv=("sh", "-c", script), ready=ready,
                       depends_on=depends_on, outlives_dependants=outlives_dependants)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose (its parent has not reaped it yet).
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


async def test_services_start_in_dependency_order_and_report_their_ready_line(tmp_path):
    marks = tmp_path / "order"
    supervisor = Supervisor([
        sh("b", f"echo b >> {marks}; echo 'b ready swarm=127.0.0.1:2'; exec sleep 60",
           ready="b", depends_on=("a",)),
        sh("a", f"sleep 0.2; echo a >> {marks}; echo 'a ready swarm=127.0.0.1:1 (note)'; "
                "exec sleep 60", ready="a"),
    ], log_dir=tmp_path / "logs", start_timeout_s=20)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert marks.read_text().split() == ["a", "b"]
        assert supervisor.ready_line("a").address("swarm") == ("127.0.0.1", 1)
        rows = supervisor.rows()
        assert [(r["service"], r["state"]) for r in rows] == [("a", "running"),
                                                              ("b", "running")]
        assert "a ready" in (tmp_path / "logs" / "a.log").read_text()
        nursery.cancel_scope.cancel()
    assert all(not alive(r["pid"]) for r in rows)


async def test_a_crashing_service_is_restarted_with_backoff(tmp_path):
    supervisor = Supervisor([sh("flaky", "echo up; echo 'disk full' >&2; exit 3")],
                            log_dir=tmp_path, backoff_min_s=0.05, backoff_max_s=0.2)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await wait_until(lambda: supervisor.rows()[0]["restarts"] >= 3, limit_s=20)
        row = supervisor.rows()[0]
        assert row["state"] in ("restarting", "running")
        assert "exited with status 3" in supervisor.services["flaky"].last_line \
            or row["state"] == "running"
        nursery.cancel_scope.cancel()
    assert "disk full" in (tmp_path / "flaky.log").read_text()


async def test_stop_kills_what_ignores_sigterm_and_its_children(tmp_path):
    pids = tmp_path / "pids"
    stubborn = sh("stubborn", f"trap '' TERM; sleep 300 & echo $! > {pids}; "
                              "echo stubborn ready; wait", ready="stubborn")
    supervisor = Supervisor([stubborn], log_dir=tmp_path, stop_timeout_s=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await wait_until(pids.exists, limit_s=10)
        child = int(pids.read_text())
        leader = supervisor.rows()[0]["pid"]
        with trio.fail_after(10):
            await supervisor.stop()
    assert not alive(leader)
    await wait_until(lambda: not alive(child), limit_s=5)  # SIGKILL lands a moment later
    assert supervisor.rows()[0]["state"] == ServiceState.STOPPED


@pytest.mark.parametrize("outlives", [True, False])
async def test_a_service_that_outlives_its_dependants_is_stopped_after_they_exited(
        tmp_path, outlives):
    """As ``up``'s DHT: the daemons unannounce through it on their way out. Without
    the mark both get SIGTERM at once and the base goes first (the control)."""
    marks = tmp_path / "order"
    supervisor = Supervisor([
        sh("base", f"trap 'echo base-term >> {marks}; exit 0' TERM; echo base ready; "
                   "while :; do sleep 0.05; done", ready="base", outlives_dependants=outlives),
        sh("top", f"trap 'sleep 0.3; echo top-exit >> {marks}; exit 0' TERM; "
                  "echo top ready; while :; do sleep 0.05; done",
           ready="top", depends_on=("base",)),
    ], log_dir=tmp_path, stop_timeout_s=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        nursery.cancel_scope.cancel()  # as up's Ctrl-C
    expected = ["top-exit", "base-term"] if outlives else ["base-term", "top-exit"]
    assert marks.read_text().split() == expected
    assert all(not alive(row["pid"]) for row in supervisor.rows())


async def test_what_a_service_prints_while_it_stops_reaches_its_log(tmp_path):
    """Its stdout is still read after ``up`` was cancelled: the line is kept and the
    service is not killed by a closed pipe on its way out."""
    supervisor = Supervisor([
        sh("chatty", "trap 'sleep 0.1; echo stopped cleanly; exit 7' TERM; echo chatty ready; "
                     "while :; do sleep 0.05; done", ready="chatty"),
    ], log_dir=tmp_path, stop_timeout_s=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        process = supervisor.services["chatty"].process
        nursery.cancel_scope.cancel()
    assert "stopped cleanly" in (tmp_path / "chatty.log").read_text()
    assert process.returncode == 7  # not SIGPIPE's death


async def test_a_service_that_never_gets_ready_fails_the_start_and_stops_the_rest(tmp_path):
    supervisor = Supervisor([
        sh("first", "echo first ready; exec sleep 60", ready="first"),
        sh("mute", "exec sleep 60", ready="mute", depends_on=("first",)),
    ], log_dir=tmp_path, start_timeout_s=0.5)
    with pytest.raises(StartFailed, match=r"mute was not ready within 0\.5 s"):
        await supervisor.run()
    assert all(not alive(row["pid"]) for row in supervisor.rows())


def test_a_dependency_cycle_or_unknown_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cycle"):
        Supervisor([sh("a", "true", depends_on=("b",)), sh("b", "true", depends_on=("a",))],
                   log_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown c"):
        Supervisor([sh("a", "true", depends_on=("c",))], log_dir=tmp_path)
