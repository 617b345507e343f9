"""``cosmicac racks``: the workers' racks registered with wrk-ork (operators only).

A rack is a worker: its key is the worker's public key (64 hex characters,
``cosmicac keys show`` on the worker's machine); a command that takes a RACK also
takes its name when one rack has it. Only the platform operators (owners and
admins of the first admin's team) may call these; others get the API's 403
message and exit 1.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import typer

from ._console import err, fail
from ._help import add_note
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

__all__ = ["app", "resolve_rack"]

app = typer.Typer(help=f"Racks (workers) wrk-ork places jobs on: list, add, remove; "
                       f"operators only. {EXIT_CODES_HELP}", no_args_is_help=True)

_KEY = re.compile(r"^[0-9a-fA-F]{64}$")


def resolve_rack(api: Api, rack: str) -> str:
    """The key of the rack whose key, or else whose name, is ``rack``; exit 1 if none
    or many. A key is taken as it is (the API says if it is not registered)."""
    if _KEY.match(rack):
        return rack.lower()
    named = [r["key"] for r in api.get("/racks")["racks"] if r["name"] == rack]
    if len(named) == 1:
        return named[0]
    if named:
        fail(f"{len(named)} racks are named {rack!r}: give its key ({', '.join(named)})",
             code=REFUSED)
    fail(f"no rack named {rack!r}, and it is no rack key (64 hex characters); see "
         f"`cosmicac racks list`", code=REFUSED)


def _row(rack: dict) -> tuple:
    state = "silent" if rack["silent"] else "up" if rack["reported"] else "not reported yet"
    return (rack["key"], rack["name"], rack["location"], rack["nodes"], rack["gpus"],
            rack["free"], rack["jobs"], state)


_COLUMNS = (Column("key"), Column("name", cut=True), Column("location", drop=2),
            Column("nodes", drop=4), Column("gpus", drop=3), Column("free"),
            Column("jobs", drop=5), Column("state"))


@app.command("list")
def list_racks(server: str | None = server_option(), output: str = output_option(),
               no_headers: bool = no_headers_option(),
               query: str | None = query_option()) -> None:
    """Registered racks with their capacity, free GPUs and jobs.

    Example: cosmicac racks list -o json
    """
    shown = Output.of(output, no_headers, query)
    racks = api_for(server).get("/racks")["racks"]
    emit(shown, racks, _COLUMNS, [_row(r) for r in racks])


@app.command("add")
def add(key: str = typer.Argument(..., help="The worker's public key (64 hex)."),
        location: str = typer.Option("default", "--location", "-l",
                                     help="Where the rack is; jobs ask for a location."),
        name: str | None = typer.Option(None, "--name", "-n", help="A name to show."),
        server: str | None = server_option(), output: str = output_option()) -> None:
    """Register a worker's rack so wrk-ork places jobs on it.

    Example: cosmicac racks add 9f3e... --location eu-1 --name rack-1
    """
    check_output(output)
    if not _KEY.match(key):
        fail(f"KEY is the worker's public key, 64 hex characters, not {key!r}", code=2)
    body: dict[str, str] = {"rack": key.lower(), "location": location}
    if name is not None:
        body["name"] = name
    rack = api_for(server).post("/racks", body)
    emit(output, rack, _COLUMNS, [_row(rack)])


@app.command("remove")
def remove(rack: str = typer.Argument(..., help="The rack's key or name."),
           server: str | None = server_option()) -> None:
    """Remove a rack (wrk-ork refuses while jobs run on it).

    Example: cosmicac racks remove rack-1
    """
    api = api_for(server)
    key = resolve_rack(api, rack)
    api.request("DELETE", f"/racks/{quote(key, safe='')}")
    err.print(f"removed rack {key}")


add_note((list_racks, add, remove), EXIT_CODES_HELP)
