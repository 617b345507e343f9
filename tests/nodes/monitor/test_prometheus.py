"""``GET /jobs/{id}/metrics``: a job's request rate, error rate and first-byte p95
read back from the Prometheus app-node named (query_range, one series each, NaN as
null); 503 without Prometheus, 502 with Prometheus' own message when it fails, the
token guards it; the holder's reader follows observability.set. In process: the
monitor's app and a Prometheus double, both through httpx's ASGITransport."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from contracts.monitor import Observability
from nodes.monitor._buffer import LogBuffer
from nodes.monitor._http import LogsFront, create_app
from nodes.monitor.observability import ObservabilityHolder
from nodes.monitor.prometheus import PrometheusReader, job_queries

TOKEN = "t" * 32


class FakePrometheus:
    """Answers ``query_range`` as Prometheus documents it; remembers each request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.fail: str | None = None

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/api/v1/query_range", self.query_range)])

    async def query_range(self, request: Request) -> JSONResponse:
        params = dict(request.query_params)
        self.requests.append(params)
        if self.fail is not None:
            return JSONResponse({"status": "error", "errorType": "bad_data",
                                 "error": self.fail}, status_code=422)
        start, step = float(params["start"]), float(params["step"])
        query = params["query"]
        if query.startswith("max("):
            values = [[start, "0.25"], [start + step, "0.5"]]
        elif " / " in query:
            values = [[start, "NaN"], [start + step, "0.1"]]
        else:
            values = [[start, "0"], [start + step, "2.5"]]
        return JSONResponse({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {}, "values": values}]}})


def _front(prom: FakePrometheus | None) -> tuple[LogsFront, httpx.AsyncClient]:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=prom.app())) if prom else None
    reader = PrometheusReader("http://prom:9090", client) if client else None
    front = LogsFront(buffer=LogBuffer(), registry=CollectorRegistry(), token=TOKEN,
                      prometheus=lambda: reader)
    api = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(front)),
                            base_url="http://monitor",
                            headers={"authorization": f"Bearer {TOKEN}"})
    return front, api


async def test_a_jobs_metrics_come_from_prometheus_as_three_series():
    prom = FakePrometheus()
    _, api = _front(prom)
    async with api:
        response = await api.get("/jobs/j-1/metrics", params={"minutes": "60"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["job_id"], body["minutes"], body["step_s"]) == ("j-1", 60, 30)
    start = body["start"]
    assert body["series"] == {
        "request_rate": [[start, 0.0], [start + 30, 2.5]],
        "error_rate": [[start, None], [start + 30, 0.1]],  # 0/0 is no figure, not 0
        "first_byte_p95_s": [[start, 0.25], [start + 30, 0.5]]}
    assert [r["query"] for r in prom.requests] == list(job_queries("j-1", 120).values())
    assert {r["step"] for r in prom.requests} == {"30"}


def test_the_queries_name_the_forwarded_series_and_quote_the_job():
    queries = job_queries('a"b', 120)
    assert queries["request_rate"] == (
        'sum(rate(cosmicac_proxy_requests_total{job_id="a\\"b"}[120s]))')
    assert 'status=~"5.."' in queries["error_rate"]
    assert queries["first_byte_p95_s"] == (
        'max(cosmicac_model_first_byte_p95_seconds{job_id="a\\"b"})')


async def test_without_prometheus_it_is_503_and_prometheus_errors_are_502():
    _, api = _front(None)
    async with api:
        response = await api.get("/jobs/j-1/metrics")
        assert (response.status_code, response.json()["error"]["code"]) == (
            503, "PROMETHEUS_UNAVAILABLE")
    prom = FakePrometheus()
    prom.fail = "parse error at char 3"
    _, api = _front(prom)
    async with api:
        response = await api.get("/jobs/j-1/metrics")
        assert response.status_code == 502
        assert "parse error at char 3" in response.json()["error"]["message"]
        assert (await api.get("/jobs/j-1/metrics", params={"minutes": "0"})).status_code == 400
        anonymous = await api.get("/jobs/j-1/metrics", headers={"authorization": ""})
        assert anonymous.status_code == 401


@pytest.mark.parametrize("minutes,step", [(1, 15), (60, 30), (1440, 720)])
async def test_the_step_keeps_a_chart_within_its_points(minutes, step):
    prom = FakePrometheus()
    _, api = _front(prom)
    async with api:
        body = (await api.get("/jobs/j/metrics", params={"minutes": minutes})).json()
    assert body["step_s"] == step and minutes * 60 / step <= 120


async def test_the_holders_reader_follows_what_app_node_sets(nursery):
    holder = ObservabilityHolder()
    await nursery.start(holder.run)
    assert holder.prometheus is None
    await holder.set(Observability(prometheus_url="http://u:p@prom:9090/"))
    assert holder.prometheus is not None and holder.prometheus.url == "http://prom:9090"
    await holder.set(Observability())
    assert holder.prometheus is None
