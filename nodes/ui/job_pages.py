"""The job pages: the new-job form (and Duplicate), a job's page with its live
overview, and its actions (Restart, Delete, each replica's Restart and Delete).

Every action is a form: POST, then 303 back to the page, so it works without
JavaScript and a reload never sends it twice; a refusal shows the API's message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from contracts.model import Runtime

from .api import ApiClient, ApiError
from .guard import request_is_https
from .live import DONE, KEEPALIVE, Piece, TopicSource
from .views import JOB_FIELDS, FormErrors, form_field, job_body, job_form, job_view

if TYPE_CHECKING:
    from .app import UiApp

__all__ = ["JobPages"]


class JobPages:
    """The job routes of ``ui``."""

    def __init__(self, ui: UiApp) -> None:
        self._ui = ui
        ui.live.register("job", self._topic)

    def routes(self) -> list[Route]:
        return [
            Route("/jobs/new", self._new),
            Route("/jobs", self._create, methods=["POST"]),
            Route("/jobs/{job}", self._job),
            Route("/jobs/{job}/restart", self._restart, methods=["POST"]),
            Route("/jobs/{job}/delete", self._delete, methods=["POST"]),
            Route("/jobs/{job}/replicas/{replica:int}/restart", self._restart_replica,
                  methods=["POST"]),
            Route("/jobs/{job}/replicas/{replica:int}/delete", self._delete_replica,
                  methods=["POST"]),
        ]

    # -- the form ----------------------------------------------------------------

    async def _new(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            source = request.query_params.get("from")
            job = await api.get(f"/jobs/{_id(source)}") if source else None
            heading = f"Duplicate {job['name']}" if job else "New job"
            return await self._form_page(api, me, job_form(job), FormErrors(), heading)

        return await self._ui.page(request, work)

    async def _create(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            form = await self._ui.form(request, *JOB_FIELDS)
            body, errors = job_body(form)
            if not errors:
                try:
                    job = await api.post("/jobs", body)
                except ApiError as error:
                    errors.add(error.readable(), form_field(error.field), frozenset(JOB_FIELDS))
                    return await self._form_page(api, me, form, errors, "New job",
                                                 status=_status(error))
                return RedirectResponse(f"/jobs/{_id(job['id'])}", status_code=303)
            return await self._form_page(api, me, form, errors, "New job", status=422)

        return await self._ui.page(request, work)

    async def _form_page(self, api: ApiClient, me: dict[str, Any], form: dict[str, str],
                         errors: FormErrors, heading: str, status: int = 200) -> Response:
        masters = (await api.get("/models"))["models"]
        models = [{"name": m["name"], "label": _model_label(m)} for m in masters]
        if form.get("model") and form["model"] not in {m["name"] for m in models}:
            models.insert(0, {"name": form["model"], "label": form["model"]})
        return self._ui.render("job_new.html", me, heading=heading, section="jobs",
                               form=form, errors=errors, models=models,
                               runtimes=[r.value for r in Runtime], status=status)

    # -- a job's page -------------------------------------------------------------

    async def _job(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            try:
                job = await api.get(f"/jobs/{_id(request.path_params['job'])}")
            except ApiError as error:
                if error.status == 404:
                    return self._ui.render(
                        "error.html", me, status=404, heading="No such job",
                        message="This job does not exist, or it was deleted.", back="/jobs")
                raise
            view = job_view(job, self._ui.wall())
            return self._ui.render("job.html", me, heading=job["name"], section="jobs",
                                   job=view, base_url=_openai_base(request),
                                   topics=[f"job:{job['id']}"], tab="overview")

        return await self._ui.page(request, work)

    async def _restart(self, request: Request) -> Response:
        return await self._action(request, "POST", "restart")

    async def _delete(self, request: Request) -> Response:
        return await self._action(request, "DELETE", "", then="/jobs")

    async def _restart_replica(self, request: Request) -> Response:
        replica = request.path_params["replica"]
        return await self._action(request, "POST", f"replicas/{replica}/restart")

    async def _delete_replica(self, request: Request) -> Response:
        replica = request.path_params["replica"]
        return await self._action(request, "DELETE", f"replicas/{replica}")

    async def _action(self, request: Request, method: str, tail: str,
                      then: str | None = None) -> Response:
        job = _id(request.path_params["job"])

        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            try:
                await api.call(method, f"/jobs/{job}/{tail}".rstrip("/"))
            except ApiError as error:
                return self._ui.error_page(error, me, back=f"/jobs/{job}")
            return RedirectResponse(then or f"/jobs/{job}", status_code=303)

        return await self._ui.page(request, work)

    # -- its topic: ``job:ID`` ---------------------------------------------------------

    def _topic(self, request: Request, job_id: str, resume: str | None) -> TopicSource:
        if not job_id:
            raise ValueError("a job's id: job:ID")
        job = _id(job_id)
        base_url = _openai_base(request)

        def gone(error: ApiError) -> list[Piece] | None:
            return self._gone() if error.status == 404 else None

        async def translate(api: ApiClient, events: AsyncIterator[tuple[str, str]]
                            ) -> AsyncIterator[Piece]:
            async for piece in self._events(events, base_url):
                yield piece

        return TopicSource(f"/jobs/{job}/events", translate, opening_failed=gone)

    async def _events(self, events: AsyncIterator[tuple[str, str]], base_url: str
                      ) -> AsyncIterator[Piece]:
        """The overview first (app-node's stream starts with the job), then again after
        each change; 'deleted' when the job is gone. Ends with app-node's stream."""
        async for event, data in events:
            if not event:
                yield KEEPALIVE
            elif event == "job":
                view = job_view(json.loads(data), self._ui.wall())
                yield self._ui.fragment("_job_overview.html", job=view, oob=True,
                                        base_url=base_url)
            elif event == "gone":
                for piece in self._gone():
                    yield piece
                return
            elif event == "lagged":
                return

    def _gone(self) -> list[Piece]:
        """The overview says the job was deleted; the topic ends for good."""
        return [self._ui.fragment("_job_overview.html", gone=True, oob=True), DONE]


def _id(value: str | None) -> str:
    """A job id as a path segment (whatever the browser sent)."""
    return quote(value or "", safe="")


def _model_label(master: dict[str, Any]) -> str:
    defaults = master.get("defaults") or {}
    gpus = defaults.get("gpus")
    extra = f", {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else ""
    return f"{master['name']} ({master['runtime']}{extra})"


def _openai_base(request: Request) -> str:
    """The OpenAI base URL as the browser reaches the platform (the entry point)."""
    host = request.headers.get("x-forwarded-host") or request.headers.get("host", "")
    scheme = "https" if request_is_https(request.url.scheme, request.headers) else "http"
    return f"{scheme}://{host}/inference/v1"


def _status(error: ApiError) -> int:
    return error.status if 400 <= error.status < 500 else 502
