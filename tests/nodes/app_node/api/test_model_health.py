"""``model_health`` in ``GET /api/jobs`` and ``GET /api/jobs/{job}``, from a real
in-process wrk-monitor over the swarm: what the proxies reported, apart from the job's
status; null for a container job, a job no proxy reports, wrk-monitor refusing
app-node's key, wrk-monitor stopped (the routes answer at once, not after a
client timeout), and no wrk-monitor configured."""

from __future__ import annotations

import trio

from contracts.monitor import LATENCY_BUCKETS, JobWindow, MetricsReport

from ....p2p.helpers import wait_until
from .apis import Api, bearer
from .support import _inference

PROXY = b"\x05" * 32


def report(api: Api, **errors_by_job: int) -> None:
    """A proxy's report: 100 requests per job, ``errors`` of them failed."""
    service = api.monitor_service
    assert service is not None
    jobs = tuple(JobWindow(job_id=job, requests=100, errors=errors,
                           first_byte_ms=(100 - errors,) + (0,) * (LATENCY_BUCKETS - 1),
                           requests_total={"200": 100 - errors, "502": errors})
                 for job, errors in errors_by_job.items())
    service.health.accept(PROXY, MetricsReport(window_s=60, jobs=jobs), service.clock())


async def _jobs(api: Api, owner: str) -> tuple[str, str, str]:
    ids = []
    for body in (_inference(), _inference(name="quiet", served_name="quiet"),
                 {"name": "box", "type": "container", "image": _inference()["image"]}):
        r = await api.client.post("/api/jobs", headers=bearer(owner), json=body)
        assert r.status_code == 201, r.text
        assert r.json()["model_health"] is None
        ids.append(r.json()["id"])
    return ids[0], ids[1], ids[2]


async def _health(api: Api, owner: str) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """Each job's model_health by ``GET /api/jobs`` and by ``GET /api/jobs/{job}``."""
    r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert r.status_code == 200, r.text
    listed = {job["id"]: job["model_health"] for job in r.json()["jobs"]}
    one = {}
    for job in listed:
        r = await api.client.get(f"/api/jobs/{job}", headers=bearer(owner))
        assert r.status_code == 200, r.text
        one[job] = r.json()["model_health"]
    return listed, one


async def test_jobs_carry_the_model_health_wrk_monitor_judged(logs_api: Api) -> None:
    api = logs_api
    owner = await api.signup()
    with trio.fail_after(30):
        busy, quiet, box = await _jobs(api, owner)
        assert api.services.monitor is not None
        await wait_until(lambda: api.services.monitor.connected, limit_s=10)
        report(api, **{busy: 10, box: 0})
        listed, one = await _health(api, owner)
        # 10% errors: Degraded, whatever the job's status; a container job never has
        # model health (even if something reported it); an unreported one is unknown.
        assert listed == one == {busy: "Degraded", quiet: None, box: None}
        r = await api.client.get(f"/api/jobs/{busy}", headers=bearer(owner))
        assert r.json()["status"] != "Degraded" and r.json()["type"] == "inference"

        report(api, **{busy: 40, quiet: 0})
        listed, one = await _health(api, owner)
        assert listed == one == {busy: "Unhealthy", quiet: "Healthy", box: None}


async def test_a_refusing_or_stopped_wrk_monitor_leaves_model_health_null(logs_api: Api) -> None:
    api = logs_api
    owner = await api.signup()
    monitor, service = api.services.monitor, api.monitor_service
    assert monitor is not None and service is not None and api.monitor_scope is not None
    with trio.fail_after(30):
        busy, quiet, box = await _jobs(api, owner)
        await wait_until(lambda: monitor.connected, limit_s=10)
        report(api, **{busy: 0})
        followers = set(service.followers)
        service.followers.clear()  # app-node's key no longer allowed: FORBIDDEN
        listed, one = await _health(api, owner)
        assert listed == one == {busy: None, quiet: None, box: None}
        service.followers.update(followers)
        assert (await _health(api, owner))[0][busy] == "Healthy"

        api.monitor_scope.cancel()
        await wait_until(lambda: not monitor.connected, limit_s=10)
        # A client whose calls would wait a minute for the connection: the jobs
        # routes must not (fail_after below is far shorter).
        monitor.timeout_s = 60.0
    with trio.fail_after(10):
        listed, one = await _health(api, owner)
        assert listed == one == {busy: None, quiet: None, box: None}


async def test_without_wrk_monitor_model_health_is_null(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    with trio.fail_after(30):
        await _jobs(api, owner)
        listed, one = await _health(api, owner)
        assert set(listed.values()) == set(one.values()) == {None}


async def test_jobs_carry_when_their_agents_were_last_heard_from(logs_api: Api) -> None:
    """The least recently heard agent's time (its worker's report, read on wrk-monitor's
    clock), for every job type; null for a job no worker names."""
    from contracts.monitor import AgentMetrics, AgentMetricsReport

    api = logs_api
    owner = await api.signup()
    with trio.fail_after(30):
        busy, quiet, box = await _jobs(api, owner)
        service = api.monitor_service
        assert service is not None and api.services.monitor is not None
        await wait_until(lambda: api.services.monitor.connected, limit_s=10)
        agents = tuple(AgentMetrics(job_id=job, replica=replica, node_rank=0,
                                    service="agent-inference",
                                    values={"heard_age_seconds": age})
                       for job, replica, age in ((busy, 0, 1.0), (busy, 1, 120.0),
                                                 (box, 0, 0.0)))
        before = service.wall_clock()
        service.agent_metrics.accept(b"\x06" * 32, AgentMetricsReport(agents=agents),
                                     service.clock())
        r = await api.client.get("/api/jobs", headers=bearer(owner))
        heard = {job["id"]: job["agents_heard_at"] for job in r.json()["jobs"]}
        assert heard[quiet] is None
        assert before - 121 <= heard[busy] <= service.wall_clock() - 120  # the silent one
        assert before - 1 <= heard[box] <= service.wall_clock()
        one = await api.client.get(f"/api/jobs/{busy}", headers=bearer(owner))
        # Read again a moment later: the same time (give or take the clocks' ticks).
        assert abs(one.json()["agents_heard_at"] - heard[busy]) < 0.5
