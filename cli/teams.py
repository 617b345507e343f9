"""``cosmicac teams``: the caller's teams, their members, invitations, the active team,
and GPU quotas (``teams quota get/set``; operators set them).

A TEAM is given by id or by name (the caller's teams are looked up to find it;
a name two of them share must be given by id). ``teams quota`` also takes the
id of a team the caller is not in (an operator's case).
"""

from __future__ import annotations

import datetime
from urllib.parse import quote

import typer

from ._completion import team_names
from ._console import err, fail
from ._output import Column, Output, no_headers_option, query_option
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

app = typer.Typer(help=f"Teams: list, get, create, members, invite, invitations, "
                       f"revoke-invite, use (the active team), quota (GPU quotas). "
                       f"{EXIT_CODES_HELP}", no_args_is_help=True)
quota_app = typer.Typer(help=f"A team's GPU quotas: get (members, operators), set "
                             f"(operators). A job that would take the team, or the member "
                             f"creating it, past a quota is refused (exit 1). "
                             f"{EXIT_CODES_HELP}", no_args_is_help=True)
app.add_typer(quota_app, name="quota")

_ROLES = ("member", "admin", "owner")


def resolve_team(api: Api, team: str, *, any_id: bool = False) -> dict:
    """The caller's team whose id, or else whose name, is ``team``; exit 1 if none or many.

    ``any_id``: a ``team`` that is none of the caller's is taken as a team id
    (``{"id": team, "name": team}``), for the server to judge (operators).
    """
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
    if any_id:
        return {"id": team, "name": team}
    fail(f"you are in no team {team!r} (see `cosmicac teams list`)", code=REFUSED)


def _gpus(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


@app.command("list")
def list_teams(server: str | None = server_option(), output: str = output_option(),
               no_headers: bool = no_headers_option(),
               query: str | None = query_option()) -> None:
    """The teams you are in, with your role and their GPU quotas; * marks the active one.

    Example: cosmicac teams list -o json
    """
    shown = Output.of(output, no_headers, query)
    api = api_for(server)
    teams = api.get("/teams")["teams"]
    active = api.get("/me").get("active_team") if not shown.is_document else None
    emit(shown, teams, (Column("id"), Column("name", cut=True), Column("role"),
                        Column("active"), Column("GPU quota", drop=2),
                        Column("per user", drop=1)),
         [(t["id"], t["name"], t["role"], "*" if t["id"] == active else "",
           _gpus(t["quota"]["gpus"]), _gpus(t["quota"]["per_user_gpus"])) for t in teams])


@app.command("get")
def get(team: str = typer.Argument(..., help="The team (id or name).", autocompletion=team_names),
        server: str | None = server_option(), output: str = output_option(),
        no_headers: bool = no_headers_option(),
        query: str | None = query_option()) -> None:
    """One of your teams: your role and its GPU quotas.

    Example: cosmicac teams get research -o json
    """
    shown = Output.of(output, no_headers, query)
    api = api_for(server)
    found = api.get(f"/teams/{quote(resolve_team(api, team)['id'], safe='')}")
    quota = found["quota"]
    emit(shown, found, ("id", "name", "role", "GPU quota", "per user"),
         [(found["id"], found["name"], found["role"], _gpus(quota["gpus"]),
           _gpus(quota["per_user_gpus"]))])


@app.command("create")
def create(name: str = typer.Argument(..., help="The new team's name."),
           server: str | None = server_option(), output: str = output_option()) -> None:
    """Create a team; you own it. Operators only, unless the platform lets every user.

    Example: cosmicac teams create research
    """
    check_output(output)
    team = api_for(server).post("/teams", {"name": name})
    emit(output, team, ("id", "name", "role"), [(team["id"], team["name"], team["role"])])


@app.command("members")
def members(team: str = typer.Argument(..., help="The team (id or name).",
                                       autocompletion=team_names),
            server: str | None = server_option(), output: str = output_option(),
            no_headers: bool = no_headers_option(),
            query: str | None = query_option()) -> None:
    """The team's members and their roles.

    Example: cosmicac teams members research -o json
    """
    shown = Output.of(output, no_headers, query)
    api = api_for(server)
    found = resolve_team(api, team)
    listed = api.get(f"/teams/{quote(found['id'], safe='')}/members")["members"]
    emit(shown, listed, (Column("email"), Column("name", cut=True), Column("role"),
                         Column("user id", drop=1)),
         [(m["user"]["email"], m["user"]["name"], m["role"], m["user"]["id"])
          for m in listed])


@app.command("invite")
def invite(team: str = typer.Argument(..., help="The team (id or name).",
                                      autocompletion=team_names),
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
def use(team: str = typer.Argument(..., help="The team (id or name).", autocompletion=team_names),
        server: str | None = server_option()) -> None:
    """Make a team the active one (API keys and jobs default to it).

    Example: cosmicac teams use research
    """
    api = api_for(server)
    found = resolve_team(api, team)
    api.request("PUT", "/me/active-team", json_body={"team_id": found["id"]})
    err.print(f"active team: {found['name']} ({found['id']})")


@app.command("invitations")
def invitations(team: str = typer.Argument(..., help="The team (id or name).",
                                           autocompletion=team_names),
                server: str | None = server_option(), output: str = output_option(),
                no_headers: bool = no_headers_option(),
                query: str | None = query_option()) -> None:
    """The team's pending invitations (admins and owners).

    Example: cosmicac teams invitations research -o json
    """
    shown = Output.of(output, no_headers, query)
    api = api_for(server)
    found = resolve_team(api, team)
    pending = api.get(f"/teams/{quote(found['id'], safe='')}/invitations")["invitations"]
    emit(shown, pending, ("invitation", "email", "role", "expires"),
         [(i["id"], i["email"], i["role"], _when(i["expires_at"])) for i in pending])


@app.command("revoke-invite")
def revoke_invite(team: str = typer.Argument(..., help="The team (id or name).",
                                             autocompletion=team_names),
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


def _team_or_active(api: Api, team: str | None) -> dict:
    """``--team`` (id or name), else the active team."""
    if team is not None:
        return resolve_team(api, team)
    active = api.get("/me").get("active_team")
    if not active:
        fail("no active team: give --team, or choose one with `cosmicac teams use`",
             code=2)
    return resolve_team(api, active, any_id=True)


def _member(api: Api, team: dict, user: str) -> dict:
    """The member ``user`` names (an email or a user id) in ``team``."""
    listed = api.get(f"/teams/{quote(team['id'], safe='')}/members")["members"]
    for member in listed:
        if user in (member["user"]["id"], member["user"]["email"]):
            return member
    fail(f"{user} is not a member of {team['name']}; see `cosmicac teams members "
         f"{team['name']}`", code=1)
    raise AssertionError("unreachable")


@app.command("accept")
def accept(token: str = typer.Argument(..., help="The token of the invitation's link "
                                                 "(…/accept?token=TOKEN)."),
           server: str | None = server_option()) -> None:
    """Accept an invitation with your session: you join its team with its role.

    Example: cosmicac teams accept 3q2…
    """
    api = api_for(server)
    joined = api.post("/invitations/accept", {"token": token})["membership"]
    err.print(f"joined team {joined['team']} as {joined['role']}")


@app.command("role")
def role(user: str = typer.Argument(..., help="The member (email or user id)."),
         new_role: str = typer.Argument(..., metavar="ROLE", help="member, admin or owner."),
         team: str | None = typer.Option(None, "--team", help="The team (id or name; "
                                                               "default: the active one).",
                                         autocompletion=team_names),
         server: str | None = server_option()) -> None:
    """Change a member's role (admins and owners; the last owner stays an owner).

    Example: cosmicac teams role bob@example.com admin
    """
    if new_role not in _ROLES:
        fail(f"ROLE is member, admin or owner, not {new_role!r}", code=2)
    api = api_for(server)
    found = _team_or_active(api, team)
    member = _member(api, found, user)
    api.request("PATCH", f"/teams/{quote(found['id'], safe='')}/members/"
                         f"{quote(member['user']['id'], safe='')}",
                json_body={"role": new_role})
    err.print(f"{member['user']['email']} is now {new_role} of {found['name']}")


@app.command("remove")
def remove(user: str = typer.Argument(..., help="The member (email or user id); "
                                                "yourself to leave the team."),
           team: str | None = typer.Option(None, "--team", help="The team (id or name; "
                                                                 "default: the active one).",
                                           autocompletion=team_names),
           server: str | None = server_option()) -> None:
    """Remove a member from the team (admins and owners), or leave it yourself.

    Example: cosmicac teams remove bob@example.com --team research
    """
    api = api_for(server)
    found = _team_or_active(api, team)
    member = _member(api, found, user)
    api.request("DELETE", f"/teams/{quote(found['id'], safe='')}/members/"
                          f"{quote(member['user']['id'], safe='')}")
    err.print(f"removed {member['user']['email']} from {found['name']}")


def _quota_limit(option: str, value: str | None) -> int | None:
    """``--gpus``/``--per-user``: a whole number of GPUs, or ``unlimited``."""
    assert value is not None
    if value.strip().lower() in ("unlimited", "none"):
        return None
    if not value.strip().isdigit():
        fail(f"{option} takes a whole number of GPUs or 'unlimited', not {value!r}", code=2)
    return int(value)


def _emit_quota(output: Output | str, team: dict, quota: dict) -> None:
    emit(output, quota, ("team", "GPU quota", "per user"),
         [(team["name"], _gpus(quota["gpus"]), _gpus(quota["per_user_gpus"]))])


@quota_app.command("get")
def quota_get(team: str = typer.Argument(..., help="The team (id or name; operators: any "
                                                   "team's id).", autocompletion=team_names),
              server: str | None = server_option(), output: str = output_option(),
              no_headers: bool = no_headers_option(),
              query: str | None = query_option()) -> None:
    """The team's GPU quotas: GPUs its jobs may hold or wait for (every replica), and
    per member (their own jobs in it); unlimited when unset.

    Example: cosmicac teams quota get research -o json
    """
    shown = Output.of(output, no_headers, query)
    api = api_for(server)
    found = resolve_team(api, team, any_id=True)
    _emit_quota(shown, found, api.get(f"/teams/{quote(found['id'], safe='')}/quota"))


@quota_app.command("set")
def quota_set(team: str = typer.Argument(..., help="The team (id or name; operators: any "
                                                   "team's id).", autocompletion=team_names),
              gpus: str | None = typer.Option(
                  None, "--gpus", help="GPUs the team's jobs may hold or wait for, every "
                                       "replica counted; 'unlimited' removes it."),
              per_user: str | None = typer.Option(
                  None, "--per-user", help="GPUs each member's own jobs in the team may "
                                           "hold or wait for; 'unlimited' removes it."),
              server: str | None = server_option(), output: str = output_option()) -> None:
    """Set the team's GPU quotas (platform operators); an option left out keeps its value.

    Jobs already running are not stopped; new ones over the quota are refused.

    Example: cosmicac teams quota set research --gpus 8 --per-user 2
    """
    check_output(output)
    body: dict[str, int | None] = {}
    if gpus is not None:
        body["gpus"] = _quota_limit("--gpus", gpus)
    if per_user is not None:
        body["per_user_gpus"] = _quota_limit("--per-user", per_user)
    if not body:
        fail("give --gpus N and/or --per-user N ('unlimited' removes a quota)", code=2)
    api = api_for(server)
    found = resolve_team(api, team, any_id=True)
    quota = api.request("PATCH", f"/teams/{quote(found['id'], safe='')}/quota",
                        json_body=body)
    _emit_quota(output, found, quota)


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M")
