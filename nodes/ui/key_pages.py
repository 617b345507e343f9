"""The API keys page: the team's keys with their last use, creating one (its secret
shown once), revoking one (after a confirmation), and a key's usage per day and model."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .api import ApiClient, ApiError
from .views import FormErrors, age

if TYPE_CHECKING:
    from .app import UiApp

__all__ = ["KeyPages"]


class KeyPages:
    """The API key routes of ``ui``."""

    def __init__(self, ui: UiApp) -> None:
        self._ui = ui

    def routes(self) -> list[Route]:
        return [
            Route("/apikeys", self._keys),
            Route("/apikeys", self._create, methods=["POST"]),
            Route("/apikeys/{key}", self._usage),
            Route("/apikeys/{key}/revoke", self._revoke, methods=["POST"]),
        ]

    async def _keys(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            session = self._ui.session_of(request)
            created = session.take_once() if session is not None else None
            return await self._page(api, me, FormErrors(), "", created)

        return await self._ui.page(request, work)

    async def _page(self, api: ApiClient, me: dict[str, Any], errors: FormErrors, name: str,
                    created: dict[str, str] | None = None, status: int = 200) -> Response:
        listed = (await api.get("/apikeys"))["keys"]
        now = self._ui.wall()
        keys = [{**key, "last_used": _last_used(key.get("last_used_ms"), now),
                 "created": age(now - float(key["created_at"]))} for key in listed]
        return self._ui.render("apikeys.html", me, heading="API keys", section="apikeys",
                               keys=keys, errors=errors, name=name, created=created,
                               status=status)

    async def _create(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            form = await self._ui.form(request, "name")
            errors = FormErrors()
            try:
                key = await api.post("/apikeys", {"name": form["name"].strip()})
            except ApiError as error:
                errors.add(error.readable(), error.field, frozenset({"name"}))
                return await self._page(api, me, errors, form["name"],
                                        status=error.status if error.status < 500 else 502)
            session = self._ui.session_of(request)
            if session is not None:
                session.once = {"name": key["name"], "key": key["key"],
                                "prefix": key["prefix"]}
            return RedirectResponse("/apikeys", status_code=303)

        return await self._ui.page(request, work)

    async def _revoke(self, request: Request) -> Response:
        key = quote(request.path_params["key"], safe="")

        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            try:
                await api.call("DELETE", f"/apikeys/{key}")
            except ApiError as error:
                return self._ui.error_page(error, me, back="/apikeys")
            return RedirectResponse("/apikeys", status_code=303)

        return await self._ui.page(request, work)

    async def _usage(self, request: Request) -> Response:
        key = request.path_params["key"]

        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            usage = await api.get("/apikeys/usage", key=key)
            return self._ui.render("apikey_usage.html", me, heading="Usage of a key",
                                   section="apikeys", key=key, rows=usage["rows"])

        return await self._ui.page(request, work)


def _last_used(ms: int | None, now: float) -> str:
    if ms is None:
        return "never"
    when = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    return f"{age(now - ms / 1000)} ago ({when})"
