"""The team page (members and roles, invitations) and the pages an email's link opens:
accepting an invitation and resetting a password. Controls show by role: a member
sees the team, an admin or owner can change it (and the API says no to a forged
request all the same)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .api import ApiClient, ApiError
from .views import FormErrors

if TYPE_CHECKING:
    from .app import UiApp

__all__ = ["TeamPages"]

_MANAGERS = ("owner", "admin")
_ROLES = ("member", "admin", "owner")


class TeamPages:
    """The team and email-link routes of ``ui``."""

    def __init__(self, ui: UiApp) -> None:
        self._ui = ui

    def routes(self) -> list[Route]:
        return [
            Route("/team", self._team),
            Route("/team/members/{user}/role", self._role, methods=["POST"]),
            Route("/team/members/{user}/remove", self._remove, methods=["POST"]),
            Route("/team/invitations", self._invite, methods=["POST"]),
            Route("/team/invitations/{invitation}/revoke", self._revoke, methods=["POST"]),
            Route("/accept", self._accept_page),
            Route("/accept", self._accept, methods=["POST"]),
            Route("/reset", self._reset_page),
            Route("/reset/request", self._reset_request, methods=["POST"]),
            Route("/reset", self._reset, methods=["POST"]),
        ]

    # -- the team -------------------------------------------------------------------

    async def _team(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            return await self._team_page(api, me, FormErrors(), {"email": "", "role": "member"})

        return await self._ui.page(request, work)

    async def _team_page(self, api: ApiClient, me: dict[str, Any], errors: FormErrors,
                         invite: dict[str, str], status: int = 200) -> Response:
        team = _active(me)
        if team is None:
            return self._ui.render("error.html", me, status=404, heading="No team",
                                   message="You are in no team yet: accept an invitation, "
                                   "or ask an operator for one.", back="/jobs")
        path = f"/teams/{quote(team['id'], safe='')}"
        members = (await api.get(f"{path}/members"))["members"]
        manager = team["role"] in _MANAGERS
        invitations = (await api.get(f"{path}/invitations"))["invitations"] if manager else []
        return self._ui.render("team.html", me, heading=f"Team {team['name']}", section="team",
                               team=team, members=members, invitations=invitations,
                               manager=manager, roles=_ROLES, errors=errors, invite=invite,
                               me_id=me["user"]["id"], status=status)

    async def _role(self, request: Request) -> Response:
        user = quote(request.path_params["user"], safe="")

        async def change(api: ApiClient, team_path: str) -> None:
            form = await self._ui.form(request, "role")
            await api.call("PATCH", f"{team_path}/members/{user}", json={"role": form["role"]})

        return await self._team_action(request, change)

    async def _remove(self, request: Request) -> Response:
        user = quote(request.path_params["user"], safe="")

        async def remove(api: ApiClient, team_path: str) -> None:
            await api.call("DELETE", f"{team_path}/members/{user}")

        return await self._team_action(request, remove)

    async def _revoke(self, request: Request) -> Response:
        invitation = quote(request.path_params["invitation"], safe="")

        async def revoke(api: ApiClient, team_path: str) -> None:
            await api.call("DELETE", f"{team_path}/invitations/{invitation}")

        return await self._team_action(request, revoke)

    async def _team_action(self, request: Request, action) -> Response:
        """``action(api, "/teams/<active team>")``, then back to the team page; the API's
        refusal as a page."""
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            team = _active(me)
            if team is None:
                return RedirectResponse("/team", status_code=303)
            try:
                await action(api, f"/teams/{quote(team['id'], safe='')}")
            except ApiError as error:
                return self._ui.error_page(error, me, back="/team")
            return RedirectResponse("/team", status_code=303)

        return await self._ui.page(request, work)

    async def _invite(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            form = await self._ui.form(request, "email", "role")
            team = _active(me)
            if team is None:
                return RedirectResponse("/team", status_code=303)
            try:
                await api.post(f"/teams/{quote(team['id'], safe='')}/invitations",
                               {"email": form["email"].strip(), "role": form["role"]})
            except ApiError as error:
                errors = FormErrors()
                errors.add(error.readable(), error.field, frozenset({"email", "role"}))
                if error.status == 403:
                    return self._ui.error_page(error, me, back="/team")
                return await self._team_page(api, me, errors, form,
                                             status=error.status if error.status < 500 else 502)
            return RedirectResponse("/team", status_code=303)

        return await self._ui.page(request, work)

    # -- an invitation's link ----------------------------------------------------------

    async def _accept_page(self, request: Request) -> Response:
        token = request.query_params.get("token", "")
        session = self._ui.session_of(request)
        return self._ui.render("accept.html", None, heading="Join a team", token=token,
                               signed_in=session is not None, errors=FormErrors(),
                               form={"email": "", "name": ""},
                               next=quote(f"/accept?token={token}", safe=""))

    async def _accept(self, request: Request) -> Response:
        form = await self._ui.form(request, "token", "email", "name", "password")
        session = self._ui.session_of(request)
        errors = FormErrors()
        try:
            if session is not None:
                await self._ui.api.as_user(session.token, self._ui.forwarded(request)).post(
                    "/invitations/accept", {"token": form["token"]})
                return RedirectResponse("/team", status_code=303)
            answer = await self._ui.browser_api(request).post("/invitations/accept", {
                "token": form["token"], "email": form["email"].strip(),
                "name": form["name"].strip(), "password": form["password"]})
        except ApiError as error:
            errors.add(error.readable(), error.field, frozenset({"email", "name", "password"}))
            return self._ui.render("accept.html", None, heading="Join a team",
                                   token=form["token"], signed_in=session is not None,
                                   errors=errors, form=form, status=_status(error),
                                   next=quote(f"/accept?token={form['token']}", safe=""))
        created = answer["session"]
        opened = self._ui.sessions.open(created["token"], created["user"]["email"],
                                        float(created["expires_at"]), self._ui.clock())
        return self._ui.signed_in(request, opened, "/team")

    # -- a password reset's link -----------------------------------------------------------

    async def _reset_page(self, request: Request) -> Response:
        token = request.query_params.get("token", "")
        return self._ui.render("reset.html", None, heading="Reset your password",
                               token=token, sent=False, errors=FormErrors(), email="")

    async def _reset_request(self, request: Request) -> Response:
        form = await self._ui.form(request, "email")
        errors = FormErrors()
        try:
            await self._ui.browser_api(request).post("/auth/password-reset",
                                                     {"email": form["email"].strip()})
        except ApiError as error:
            errors.add(error.readable(), error.field, frozenset({"email"}))
            return self._ui.render("reset.html", None, heading="Reset your password",
                                   token="", sent=False, errors=errors, email=form["email"],
                                   status=_status(error))
        return self._ui.render("reset.html", None, heading="Reset your password", token="",
                               sent=True, errors=errors, email=form["email"], status=202)

    async def _reset(self, request: Request) -> Response:
        form = await self._ui.form(request, "token", "password")
        errors = FormErrors()
        try:
            await self._ui.browser_api(request).post("/auth/password-reset/confirm",
                                    {"token": form["token"], "password": form["password"]})
        except ApiError as error:
            errors.add(error.readable(), error.field, frozenset({"password"}))
            return self._ui.render("reset.html", None, heading="Reset your password",
                                   token=form["token"], sent=False, errors=errors, email="",
                                   status=_status(error))
        return RedirectResponse("/login?reset=1", status_code=303)


def _active(me: dict[str, Any]) -> dict[str, Any] | None:
    return next((t for t in me["teams"] if t["id"] == me.get("active_team")), None)


def _status(error: ApiError) -> int:
    return error.status if 400 <= error.status < 500 else 502
