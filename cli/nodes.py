"""``cosmicac nodes``: every rack's nodes, and keeping some for one team
(operators only).

A reserved node takes only the jobs of the team it is kept for. ``--team`` is one
of your teams (id or name) or any team's id; ``--rack`` a rack's key or name.
"""

from __future__ import annotations

import typer

from ._completion import team_names
from ._console import err
from ._help import add_note
from ._output import Column, Output, no_headers_option, query_option
from .racks import resolve_rack
from .session import EXIT_CODES_HELP, Api, api_for, emit, output_option, server_option

__all__ = ["app"]

app = typer.Typer(help=f"Nodes of every rack: list, reserve for a team, release; "
                       f"operators only. {EXIT_CODES_HELP}", no_args_is_help=True)


def _rack_option() -> str:
    return typer.Option(..., "--rack", "-r", help="The rack (key or name).")


def _team_id(api: Api, team: str) -> str:
    """One of the caller's teams by id or name; else ``team`` as it is, an id (an
    operator may reserve nodes for a team they are not in; the API checks it)."""
    for candidate in api.get("/teams")["teams"]:
        if team in (candidate["id"], candidate["name"]):
            return candidate["id"]
    return team


@app.command("list")
def list_nodes(server: str | None = server_option(), output: str = output_option(),
               no_headers: bool = no_headers_option(),
               query: str | None = query_option()) -> None:
    """Every node: GPUs, free GPUs, the team it is reserved for, schedulable.

    Example: cosmicac nodes list -o json
    """
    shown = Output.of(output, no_headers, query)
    nodes = api_for(server).get("/nodes")["nodes"]
    emit(shown, nodes, (Column("node"), Column("rack", drop=1), Column("location", drop=3),
                        Column("gpus"), Column("free"), Column("reserved for", drop=2),
                        Column("schedulable", drop=4), Column("infiniband", drop=5)),
         [(n["name"], n["rack"], n["location"], n["gpus"], n["free"],
           n["reserved_for"], "yes" if n["schedulable"] else "no",
           "yes" if n["infiniband"] else "no") for n in nodes],
         names=[n["name"] for n in nodes])


@app.command("reserve")
def reserve(nodes: list[str] = typer.Argument(..., help="The nodes' names."),
            rack: str = _rack_option(),
            team: str = typer.Option(..., "--team", "-t",
                                     help="The team (one of yours by id or name, or an id).",
                                     autocompletion=team_names),
            server: str | None = server_option()) -> None:
    """Keep nodes for one team: only its jobs are placed on them.

    Example: cosmicac nodes reserve --rack rack-1 --team research n0 n1
    """
    api = api_for(server)
    body = {"rack": resolve_rack(api, rack), "nodes": nodes, "team": _team_id(api, team)}
    api.post("/nodes/reserve", body)
    err.print(f"reserved {', '.join(nodes)} for team {body['team']}")


@app.command("release")
def release(nodes: list[str] = typer.Argument(..., help="The nodes' names."),
            rack: str = _rack_option(), server: str | None = server_option()) -> None:
    """Release reserved nodes: every team's jobs may be placed on them again.

    Example: cosmicac nodes release --rack rack-1 n0 n1
    """
    api = api_for(server)
    api.post("/nodes/release", {"rack": resolve_rack(api, rack), "nodes": nodes})
    err.print(f"released {', '.join(nodes)}")


add_note((list_nodes, reserve, release), EXIT_CODES_HELP)
