"""The platform operators' pages: racks and their nodes (reserve a node for a team,
release it), users, and the control plane's health now and over time. Shown in the
navigation to operators only (``/api/me``'s ``operator``); anyone else opening one
gets the API's refusal in words."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .api import ApiClient, ApiError
from .live import KEEPALIVE, Piece, TopicSource
from .views import age

if TYPE_CHECKING:
    from .app import UiApp

__all__ = ["OperatorPages"]


class OperatorPages:
    """The operators' routes of ``ui``."""

    def __init__(self, ui: UiApp) -> None:
        self._ui = ui
        ui.live.register("racks", self._topic)

    def routes(self) -> list[Route]:
        return [
            Route("/racks", self._racks),
            Route("/nodes/reserve", self._reserve, methods=["POST"]),
            Route("/nodes/release", self._release, methods=["POST"]),
            Route("/users", self._users),
            Route("/health", self._health),
        ]

    async def _racks(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            racks = (await api.get("/racks"))["racks"]
            nodes = (await api.get("/nodes"))["nodes"]
            return self._ui.render("racks.html", me, heading="Racks and nodes",
                                   section="racks", racks=_by_rack(racks, nodes, me["teams"]),
                                   teams=me["teams"], topics=["racks"])

        return await self._ui.page(request, work)

    def _topic(self, request: Request, argument: str, resume: str | None) -> TopicSource:
        """``racks``: the racks' capacity, again after each change that moved it."""
        async def translate(api: ApiClient, events: AsyncIterator[tuple[str, str]]
                            ) -> AsyncIterator[Piece]:
            teams = (await api.get("/me"))["teams"]
            async for event, data in events:
                if not event:
                    yield KEEPALIVE
                elif event == "racks":
                    capacity = json.loads(data)
                    yield self._ui.fragment(
                        "_racks_body.html", oob=True, teams=teams,
                        racks=_by_rack(capacity["racks"], capacity["nodes"], teams))
                elif event == "lagged":
                    return

        return TopicSource("/racks/events", translate)

    async def _reserve(self, request: Request) -> Response:
        return await self._nodes(request, "/nodes/reserve", with_team=True)

    async def _release(self, request: Request) -> Response:
        return await self._nodes(request, "/nodes/release", with_team=False)

    async def _nodes(self, request: Request, path: str, *, with_team: bool) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            form = await self._ui.form(request, "rack", "node", "team")
            body: dict[str, Any] = {"rack": form["rack"], "nodes": [form["node"]]}
            if with_team:
                body["team"] = form["team"]
            try:
                await api.post(path, body)
            except ApiError as error:
                return self._ui.error_page(error, me, back="/racks")
            return RedirectResponse("/racks", status_code=303)

        return await self._ui.page(request, work)

    async def _users(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            listed = await api.get("/users", limit="200", cursor=request.query_params.get(
                "cursor"))
            now = self._ui.wall()
            users = [{**u, "age": age(now - float(u["created_at"]))} for u in listed["users"]]
            return self._ui.render("users.html", me, heading="Users", section="users",
                                   users=users, next=listed.get("next"))

        return await self._ui.page(request, work)

    async def _health(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            now = await api.get("/health")
            history = await api.get("/health/history", since="1h", limit="200")
            return self._ui.render("health.html", me, heading="Control-plane health",
                                   section="health", now=now,
                                   rows=list(reversed(history["rows"]))[:60],
                                   truncated=history["truncated"])

        return await self._ui.page(request, work)


def _by_rack(racks: list[dict[str, Any]], nodes: list[dict[str, Any]],
             teams: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rack with its nodes' rows: GPUs used and free, and whom a node is kept for."""
    names = {t["id"]: t["name"] for t in teams}
    return [{**rack, "node_rows": [
        {**node, "used": node["gpus"] - node["free"],
         "reserved_name": names.get(node["reserved_for"] or "", node["reserved_for"])}
        for node in nodes if node["rack"] == rack["key"]]} for rack in racks]
