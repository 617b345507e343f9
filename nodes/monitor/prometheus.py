"""A job's model metrics over time, read back from the operator's Prometheus.

Prometheus scrapes wrk-monitor's ``/metrics``, where the proxies' figures are
forwarded (``_health_metrics.py``: ``cosmicac_proxy_requests_total{job_id,status}``,
``cosmicac_model_first_byte_p95_seconds{job_id}``); wrk-monitor itself keeps
only the latest window. For a job page's charts the HTTP side answers
``GET /jobs/{id}/metrics?minutes=60`` from Prometheus' ``query_range``
(``GET /api/v1/query_range?query=&start=&end=&step=``, answer
``{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},
"values":[[<unix s>, "<value>"],...]}]}}``) with three queries, each summed
over the scraped instances into one series:

============================  =====================================================
``request_rate`` (req/s)      ``sum(rate(cosmicac_proxy_requests_total{job_id=J}[W]))``
``error_rate`` (0-1)          the same over ``status=~"5.."``, divided by the above
``first_byte_p95_s``          ``max(cosmicac_model_first_byte_p95_seconds{job_id=J})``
============================  =====================================================

The step keeps a chart at most :data:`MAX_POINTS` points (60 min: 30 s); the
rate window ``W`` is four steps and at least 2 minutes, so it spans several
scrapes at Prometheus' usual 15-60 s interval. ``NaN`` (no requests: 0/0) and
infinities come back as null. Falls short: the series are Prometheus' names
for wrk-monitor's metrics as wrk-monitor exposes them; a relabelling scrape
config that renames ``job_id`` breaks the queries.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import httpx
import pydantic

from .errors import BackendError
from .loki import logql_string, split_credentials

__all__ = ["MAX_MINUTES", "MAX_POINTS", "PrometheusError", "PrometheusReader", "job_queries"]

QUERY_RANGE_PATH = "/api/v1/query_range"
#: Points per series at most (Prometheus refuses over 11,000; a chart needs far fewer).
MAX_POINTS = 120
#: The longest span asked (one day).
MAX_MINUTES = 24 * 60


class PrometheusError(BackendError):
    """Prometheus answered with an error, an undocumented body, or not at all (status 0)."""

    backend = "Prometheus"


class _Series(pydantic.BaseModel):
    metric: dict[str, str]
    values: list[tuple[float, str]]


class _Data(pydantic.BaseModel):
    resultType: Literal["matrix"]  # Prometheus' field name
    result: list[_Series]


class _Answer(pydantic.BaseModel):
    status: Literal["success"]
    data: _Data


def job_queries(job_id: str, window_s: int) -> dict[str, str]:
    """The PromQL of each series for ``job_id`` (label values quoted as PromQL strings)."""
    job = f"job_id={logql_string(job_id)}"  # PromQL strings are Go literals, as LogQL's
    all_requests = f"sum(rate(cosmicac_proxy_requests_total{{{job}}}[{window_s}s]))"
    errors = f'sum(rate(cosmicac_proxy_requests_total{{{job},status=~"5.."}}[{window_s}s]))'
    return {"request_rate": all_requests,
            "error_rate": f"{errors} / {all_requests}",
            "first_byte_p95_s": f"max(cosmicac_model_first_byte_p95_seconds{{{job}}})"}


def _number(text: str) -> float | None:
    value = float(text)  # Prometheus' "NaN", "+Inf" parse
    return value if math.isfinite(value) else None


class PrometheusReader:
    """``query_range`` against one Prometheus.

    Args:
        url: its base URL (``user:password@`` is sent as basic auth).
        client: the HTTP client to use (shared, not closed here).
    """

    def __init__(self, url: str, client: httpx.AsyncClient) -> None:
        self.url, self._auth = split_credentials(url)
        self._client = client

    async def query_range(self, query: str, *, start_s: float, end_s: float,
                          step_s: float) -> list[list[float | None]]:
        """The first series' ``[unix s, value|None]`` points (empty: no data).

        Raises:
            PrometheusError: an error answer (with Prometheus' message), an
                undocumented body, or no answer (status 0).
        """
        params = {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                  "step": f"{step_s:g}"}
        try:
            response = await self._client.get(self.url + QUERY_RANGE_PATH, params=params,
                                              auth=self._auth or httpx.USE_CLIENT_DEFAULT)
        except httpx.TransportError as exc:
            raise PrometheusError(0, f"{type(exc).__name__}: {exc}", url=self.url) from exc
        if response.status_code != 200:
            try:
                message = str(response.json().get("error", response.text))
            except ValueError:
                message = response.text
            raise PrometheusError(response.status_code, message.strip()[:1000], url=self.url)
        try:
            answer = _Answer.model_validate_json(response.content)
            series = answer.data.result[0].values if answer.data.result else []
            return [[t, _number(v)] for t, v in series]
        except (pydantic.ValidationError, ValueError) as exc:
            raise PrometheusError(200, f"undocumented query_range answer: {exc}",
                                  url=self.url) from exc

    async def job_metrics(self, job_id: str, *, minutes: int, now_s: float) -> dict[str, Any]:
        """The three series of ``job_id`` over the last ``minutes`` (see the module doc)."""
        if not 1 <= minutes <= MAX_MINUTES:
            raise ValueError(f"minutes must be 1..{MAX_MINUTES}")
        step_s = max(15, math.ceil(minutes * 60 / MAX_POINTS))
        window_s = max(120, 4 * step_s)
        # Aligned to the step, as Grafana does: the same points on every refresh.
        now_s = math.floor(now_s / step_s) * step_s
        start_s = now_s - minutes * 60
        series = {name: await self.query_range(query, start_s=start_s, end_s=now_s,
                                               step_s=step_s)
                  for name, query in job_queries(job_id, window_s).items()}
        return {"job_id": job_id, "minutes": minutes, "step_s": step_s,
                "start": start_s, "end": now_s, "series": series}
