"""``cosmicac teams``: the caller's teams, their members, invitations, the active team.

A TEAM is given by id or by name (the caller's teams are looked up to find it;
a name two of them share must be given by id).
"""

from __future__ import annotations

import datetime
from urllib.parse import quote

import typer

from ._console import err, fail
from .session import (
    EXIT_CODES_HELP,
    REFUSED,
    Api,
    api_for,
    check_output,
    emit,
    output_option,
    server_option,
)

__all__ = ["app"]

app = typer.Typer(help=f"Teams: list, create, members, invite, invitations, revoke-invite, "
                       f"use (the active team). "
                       f"{EXIT_CODES_HELP}", no_args_is_help=True)

_ROLES = ("member", "admin", "owner")


def resolve_team(api: Api, team: str) -> dict:
    """The caller's team whose id, or else whose name, is ``team``; exit 1 if none or many."""
    teams = api.get("/teams")["teams"]
    for candidate in teams:
        if candidate["id"] == team:
            return candidate
    named = [candidate for candidate in teams if candidate["name"] == team]
    if len(named) == 1:
        return named[0]
    if named:
        fail(f"{len(named)} of your teams are named {team!r}: give its id "
             f"({', '.join(t['id'] for t in named)})", code=REFUSED)
    fail(f"you are in no team {team!r} (see `cosmicac teams list`)", code=REFUSED)


@app.command("list")
def list_teams(server: str | None = server_option(), output: str = output_option()) -> None:
    """The teams you are in, with your role; * marks the active one.

    Example: cosmicac teams list -o json
    """
    api = api_for(server)
    teams = api.get("/teams")["teams"]
    active = api.get("/me").get("active_team") if output != "json" else None
    emit(output, teams, ("id", "name", "role", "active"),
         [(t["id"], t["name"], t["role"], "*" if t["id"] == active else "") for t in teams])


@app.command("create")
def create(name: str = typer.Argument(..., help="The new team's name."),
           server: str | None = server_option(), output: str = output_option()) -> None:
    """Create a team; you own it.

    Example: cosmicac teams create research
    """
    check_output(output)
    team = api_for(server).post("/teams", {"name": name})
    emit(output, team, ("id", "name", "role"), [(team["id"], team["name"], team["role"])])


@app.command("members")
def members(team: str = typer.Argument(..., help="The team (id or name)."),
            server: str | None = server_option(), output: str = output_option()) -> None:
    """The team's members and their roles.

    Example: cosmicac teams members research -o json
    """
    api = api_for(server)
    found = resolve_team(api, team)
    listed = api.get(f"/teams/{quote(found['id'], safe='')}/members")["members"]
    emit(output, listed, ("email", "name", "role", "user id"),
         [(m["user"]["email"], m["user"]["name"], m["role"], m["user"]["id"])
          for m in listed])


@app.command("invite")
def invite(team: str = typer.Argument(..., help="The team (id or name)."),
           email: str = typer.Argument(..., help="Who to invite."),
           role: str = typer.Option("member", "--role", "-r", help="member, admin or owner."),
           server: str | None = server_option(), output: str = output_option()) -> None:
    """Invite someone by email (admins and owners); they get a link to accept.

    Example: cosmicac teams invite research bob@example.com --role admin
    """
    if role not in _ROLES:
        fail(f"--role takes member, admin or owner, not {role!r}", code=2)
    check_output(output)
    api = api_for(server)
    found = resolve_team(api, team)
    invitation = api.post(f"/teams/{quote(found['id'], safe='')}/invitations",
                          {"email": email, "role": role})
    emit(output, invitation, ("invitation", "team", "email", "role"),
         [(invitation["id"], found["name"], invitation["email"], invitation["role"])])


@app.command("use")
def use(team: str = typer.Argument(..., help="The team (id or name)."),
        server: str | None = server_option()) -> None:
    """Make a team the active one (API keys and jobs default to it).

    Example: cosmicac teams use research
    """
    api = api_for(server)
    found = resolve_team(api, team)
    api.request("PUT", "/me/active-team", json_body={"team_id": found["id"]})
    err.print(f"active team: {found['name']} ({found['id']})")


@app.command("invitations")
def invitations(team: str = typer.Argument(..., help="The team (id or name)."),
                server: str | None = server_option(), output: str = output_option()) -> None:
    """The team's pending invitations (admins and owners).

    Example: cosmicac teams invitations research -o json
    """
    check_output(output)
    api = api_for(server)
    found = resolve_team(api, team)
    pending = api.get(f"/teams/{quote(found['id'], safe='')}/invitations")["invitations"]
    emit(output, pending, ("invitation", "email", "role", "expires"),
         [(i["id"], i["email"], i["role"], _when(i["expires_at"])) for i in pending])


@app.command("revoke-invite")
def revoke_invite(team: str = typer.Argument(..., help="The team (id or name)."),
                  invitation: str = typer.Argument(..., help="The invitation's id (see "
                                                              "`teams invitations`)."),
                  server: str | None = server_option()) -> None:
    """Revoke a pending invitation: its link stops working (admins and owners).

    Example: cosmicac teams revoke-invite research 5c1e...
    """
    api = api_for(server)
    found = resolve_team(api, team)
    api.request("DELETE", f"/teams/{quote(found['id'], safe='')}/invitations/"
                          f"{quote(invitation, safe='')}")
    err.print(f"revoked invitation {invitation}")


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M")
