"""``cosmicac apikeys``: the team's inference API keys and what they used.

A key's secret is printed once, by ``create``: the server keeps only its hash.
Keys bill to the active team (``cosmicac teams use``) unless ``--team`` says
otherwise.
"""

from __future__ import annotations

import datetime
from urllib.parse import quote

import typer

from ._completion import served_names, team_names
from ._console import err, out, print_json
from ._output import Column, Output, no_headers_option, query_option
from .session import (
    EXIT_CODES_HELP,
    Api,
    api_for,
    check_output,
    emit,
    output_option,
    server_option,
)
from .teams import resolve_team

__all__ = ["app"]

app = typer.Typer(help=f"Inference API keys: create, list, revoke, usage. {EXIT_CODES_HELP}",
                  no_args_is_help=True)

_USAGE_COLUMNS = ("key", "day", "model", "prompt_tokens", "completion_tokens",
                  "total_tokens", "requests")


def _team_option() -> str | None:
    return typer.Option(None, "--team", "-t", help="The team (id or name); default: the "
                                                    "active team.", autocompletion=team_names)


def _team_id(api: Api, team: str | None) -> str | None:
    return resolve_team(api, team)["id"] if team else None


def _when(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M")


@app.command("create")
def create(name: str = typer.Option(..., "--name", "-n", help="What the key is for."),
           team: str | None = _team_option(),
           server: str | None = server_option(), output: str = output_option()) -> None:
    """Create a key and print its secret, this once.

    Example: cosmicac apikeys create --name ci -o json
    """
    check_output(output)
    api = api_for(server)
    body: dict[str, str] = {"name": name}
    if (team_id := _team_id(api, team)) is not None:
        body["team_id"] = team_id
    key = api.post("/apikeys", body)
    if output == "json":
        print_json(key)
        return
    # Plain lines, not a table: a narrow terminal must not cut the secret.
    out.print(f"id:   {key['id']}\nname: {key['name']}\nkey:  {key['key']}")
    err.print("keep the key now: it is not shown again")


def _list(api: Api, team: str | None) -> list[dict]:
    return api.get("/apikeys", team_id=_team_id(api, team))["keys"]


@app.command("list")
def list_keys(team: str | None = _team_option(),
              server: str | None = server_option(), output: str = output_option(),
              no_headers: bool = no_headers_option(),
              query: str | None = query_option()) -> None:
    """The team's keys (never their secrets), with when each was last used.

    Example: cosmicac apikeys list -o json
    """
    shown = Output.of(output, no_headers, query)
    keys = _list(api_for(server), team)
    emit(shown, keys, (Column("id"), Column("name", cut=True), Column("prefix", drop=4),
                       Column("created", drop=2), Column("revoked", drop=1),
                       Column("last used", drop=3)),
         [(k["id"], k["name"], k["prefix"], _when(k["created_at"]), _when(k["revoked_at"]),
           _when(k["last_used_ms"] / 1000 if k["last_used_ms"] is not None else None))
          for k in keys])


@app.command("revoke")
def revoke(key: str = typer.Argument(..., help="The key's id (see `apikeys list`)."),
           server: str | None = server_option()) -> None:
    """Revoke a key everywhere (the shared database tells every proxy).

    Example: cosmicac apikeys revoke 3f2a...
    """
    api_for(server).request("DELETE", f"/apikeys/{quote(key, safe='')}")
    err.print(f"revoked {key}")


@app.command("usage")
def usage(key: str | None = typer.Option(None, "--key", "-k",
                                         help="One key's id; default: every key of the team."),
          team: str | None = _team_option(),
          model: str | None = typer.Option(None, "--model", help="Only this model.",
                                           autocompletion=served_names),
          day_from: str | None = typer.Option(None, "--from", help="First day, YYYY-MM-DD."),
          day_to: str | None = typer.Option(None, "--to", help="Last day, YYYY-MM-DD."),
          server: str | None = server_option(), output: str = output_option(),
          no_headers: bool = no_headers_option(),
          query: str | None = query_option()) -> None:
    """Tokens and requests per key, day and model.

    With -o json: an array of {key, day, model, prompt_tokens, completion_tokens,
    total_tokens, requests, audio_seconds}.

    Example: cosmicac apikeys usage --key 3f2a... -o json
    """
    shown = Output.of(output, no_headers, query)
    api = api_for(server)
    ids = [key] if key else [k["id"] for k in _list(api, team)]
    rows = [{"key": answer["key"], **row}
            for key_id in ids
            for answer in [api.get("/apikeys/usage", key=key_id, model=model,
                                   day_from=day_from, day_to=day_to)]
            for row in answer["rows"]]
    emit(shown, rows, (Column("key"), Column("day"), Column("model", cut=True),
                       Column("prompt", drop=2), Column("completion", drop=1),
                       Column("total"), Column("requests", drop=3)),
         [[row[c] for c in _USAGE_COLUMNS] for row in rows])
