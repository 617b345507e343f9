"""A job's Logs tab: its records as they come, from app-node's numbered follow.

The page holds an empty log; its topic ``logs:ID`` (:mod:`.live`) starts with the
records wrk-monitor still holds of the job (Loki's are not read here yet), then
sends each new batch. Every record carries its number in the job and each
batch the cursor of its last one, so the stream opened again (a new tab, a
dropped connection, app-node restarted) resumes right after the last record
shown: nothing missing, nothing twice. ``static/app.js`` appends the lines
(skipping a number it already shows), keeps the view at the bottom unless the
user scrolled up, caps the lines kept, and filters System and Application
records. The workload's output is untrusted text: the template escapes it.

Who may read: the job's team. The UI reads as the signed-in user, and app-node
answers 404 for a job of another team (the topic then ends with "no such job").
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .api import ApiClient, ApiError
from .live import DONE, KEEPALIVE, Cursored, Piece, TopicSource
from .views import job_view

if TYPE_CHECKING:
    from .app import UiApp

__all__ = ["LogPages"]


class LogPages:
    """The Logs tab of ``ui``'s job pages, and its topic."""

    def __init__(self, ui: UiApp) -> None:
        self._ui = ui
        ui.live.register("logs", self._topic)

    def routes(self) -> list[Route]:
        return [Route("/jobs/{job}/logs", self._page)]

    async def _page(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            try:
                job = await api.get(f"/jobs/{_id(request.path_params['job'])}")
            except ApiError as error:
                if error.status == 404:
                    return self._ui.render(
                        "error.html", me, status=404, heading="No such job",
                        message="This job does not exist, or it was deleted.", back="/jobs")
                raise
            return self._ui.render("logs.html", me, heading=job["name"], section="jobs",
                                   job=job_view(job, self._ui.wall()),
                                   topics=[f"logs:{job['id']}"], tab="logs")

        return await self._ui.page(request, work)

    def _topic(self, request: Request, job_id: str, resume: str | None) -> TopicSource:
        if not job_id:
            raise ValueError("a job's id: logs:ID")
        params = {"follow": "1", **({"after": resume} if resume else {})}

        def unavailable(error: ApiError) -> list[Piece] | None:
            if error.status == 404:
                message = "This job does not exist, or it was deleted."
            elif error.status == 503:
                message = f"No logs to show: {error.message}"
            elif error.status == 422:  # a cursor app-node does not take: start over
                message = "This log could not be resumed: reload the page."
            else:
                return None  # app-node down and the like: the browser tries again
            return [self._ui.fragment("_log_notice.html", message=message), DONE]

        async def translate(api: ApiClient, events: AsyncIterator[tuple[str, str]]
                            ) -> AsyncIterator[Piece]:
            async for piece in self._records(events):
                yield piece

        return TopicSource(f"/jobs/{_id(job_id)}/logs", translate, params=params,
                           opening_failed=unavailable)

    async def _records(self, events: AsyncIterator[tuple[str, str]]) -> AsyncIterator[Piece]:
        """Each batch as lines, with its last record's cursor; ends at ``lagged`` (the
        stream is opened again after the last line shown)."""
        async for event, data in events:
            if not event:
                yield KEEPALIVE
            elif event == "records":
                batch = json.loads(data)
                records = batch["records"]
                if not records:
                    continue
                html = self._ui.fragment("_log_lines.html", stream=batch["stream"],
                                         records=[_line(r) for r in records])
                yield Cursored(html, f"{batch['stream']}:{records[-1]['seq']}")
            elif event == "lagged":
                return


def _line(record: dict[str, Any]) -> dict[str, Any]:
    """A record as a line shows it: the time of day to the millisecond."""
    time = str(record.get("time", ""))
    return {**record, "clock": time[11:23]}


def _id(value: str | None) -> str:
    return quote(value or "", safe="")
