"""``jobs list --watch`` and ``jobs get JOB --watch``: follow the API's event streams
(never polling) and show every change as it happens.

On a terminal the table is redrawn in place (the cursor moves back over what was
drawn, at most a screenful); through a pipe the first table is printed whole, then
one row per change, as ``kubectl get -w`` does, so a log or a ``grep`` sees each
change once. With ``-o json`` (or yaml, or a query) each change prints the job's
document on one line (JSON lines); ``-o name`` prints the changed job's id.

The team's stream (``GET /api/jobs/events``) says which job changed; the row is
then read again (``GET /api/jobs/{id}``: app-node answers it from memory), so
every column is current, not only the status. A job's own stream (``GET
/api/jobs/{id}/events``) carries the whole document. ``lagged`` (app-node dropped
the stream) subscribes again and lists again: nothing is missed. The watch ends
when the job is gone (``get``), on Ctrl-C (exit 130, as ``jobs logs -f``), or
with exit 4 when the server goes away.

The state (which jobs, in which order, what changed) is :class:`JobTable`, free of
I/O; :func:`watch_list` and :func:`watch_job` are its synchronous drivers.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import quote

import httpx
import typer

from runtime.sse import sse_events

from ._console import err, fail
from ._output import Column, Output, emit, render_table, terminal_width, use_color
from .session import UNREACHABLE, Api

__all__ = ["INTERRUPTED", "JobTable", "Screen", "watch_job", "watch_list"]

#: Exit code of a watch ended by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130
#: Longest silence on a stream before it counts as broken (keep-alives every 15 s).
SILENCE_S = 45.0
#: Times a stream is subscribed again after ``lagged`` before giving up.
RESUBSCRIBES = 100

Row = Callable[[dict, float], tuple[Any, ...]]


@dataclass
class JobTable:
    """The watched jobs, newest first, and the rows they show (no I/O)."""

    jobs: dict[str, dict] = field(default_factory=dict)

    def reset(self, jobs: list[dict]) -> None:
        self.jobs = {job["id"]: job for job in jobs}

    def put(self, job: dict) -> bool:
        """Take ``job``'s current document; True if it changed what is known."""
        known = self.jobs.get(job["id"])
        self.jobs[job["id"]] = job
        return known != job

    def remove(self, job_id: str) -> dict | None:
        return self.jobs.pop(job_id, None)

    def ordered(self) -> list[dict]:
        return sorted(self.jobs.values(), key=lambda job: (-job["created_at"], job["id"]))


class Screen:
    """A table redrawn in place on a terminal: the cursor goes back to the first line
    drawn last time and everything below is cleared."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.drawn = stream, 0

    def draw(self, lines: list[str]) -> None:
        height = shutil.get_terminal_size((80, 24)).lines
        if len(lines) > height - 1:  # a redraw can only reach back over the screen
            hidden = len(lines) - (height - 2)
            lines = [*lines[:height - 2], f"… {hidden} more (a taller window shows them)"]
        back = f"\x1b[{self.drawn}F" if self.drawn else ""
        self.stream.write(back + "\x1b[J" + "".join(f"{line}\n" for line in lines))
        self.stream.flush()
        self.drawn = len(lines)


def _headers(api: Api) -> dict[str, str]:
    return {"authorization": f"Bearer {api.token}"} if api.token else {}


def _events(client: httpx.Client, api: Api, path: str,
            params: dict[str, str]) -> Iterator[tuple[str, str]]:
    """The stream's events; ends at its end. A refusal fails as any request does."""
    timeout = httpx.Timeout(30.0, connect=5.0, read=SILENCE_S)
    with client.stream("GET", path, params=params, headers=_headers(api),
                       timeout=timeout) as response:
        if response.status_code != 200:
            response.read()
            api._fail(response)
        yield from sse_events(response.iter_lines())


def _get(client: httpx.Client, api: Api, job_id: str) -> dict | None:
    """The job now, or None once it is gone (404)."""
    response = client.get(f"/jobs/{quote(job_id, safe='')}", headers=_headers(api))
    if response.status_code == 404:
        return None
    if not response.is_success:
        api._fail(response)
    return response.json()


@dataclass
class _Shown:
    """How changes are shown: a table redrawn in place (``screen``), a row per change,
    or a document per change."""

    output: Output
    every_column: tuple[Column, ...]
    row: Row
    stream: TextIO
    screen: Screen | None = None

    @classmethod
    def of(cls, output: Output, columns: tuple[Column, ...], row: Row,
           stream: TextIO | None) -> _Shown:
        stream = stream or sys.stdout
        live = output.mode in ("table", "wide") and terminal_width(stream) is not None
        return cls(output, columns, row, stream, Screen(stream) if live else None)

    @property
    def _kept(self) -> list[int]:
        return [i for i, c in enumerate(self.every_column)
                if self.output.mode == "wide" or not c.wide]

    def _table(self, jobs: list[dict], *, headers: bool, width: int | None) -> list[str]:
        now = time.time()
        kept = self._kept
        return render_table([self.every_column[i] for i in kept],
                            [[cells[i] for i in kept] for cells in
                             (self.row(job, now) for job in jobs)],
                            headers=headers, width=width,
                            color=width is not None and use_color(self.stream))

    def table(self, table: JobTable) -> None:
        """The whole table: drawn (a terminal), or printed once (a pipe)."""
        if self.screen is not None:
            self.screen.draw(self._table(table.ordered(), headers=self.output.headers,
                                         width=terminal_width(self.stream)))
        elif self.output.mode in ("table", "wide"):
            lines = self._table(table.ordered(), headers=self.output.headers, width=None)
            self.stream.write("".join(f"{line}\n" for line in lines))
            self.stream.flush()
        else:
            for job in table.ordered():
                self.change(job)

    def change(self, job: dict, table: JobTable | None = None) -> None:
        """One job changed: the table redrawn, or one line for it."""
        if self.screen is not None and table is not None:
            self.table(table)
        elif self.output.mode in ("table", "wide"):
            self.stream.write(self._table([job], headers=False, width=None)[0] + "\n")
            self.stream.flush()
        elif self.output.mode == "name":
            emit(self.output, job, names=[job["id"]], stream=self.stream)
        else:  # a document per line, whatever -o json/yaml says: a stream of changes
            emit(Output("json", query=self.output.query), job, stream=self.stream)


def _gone_row(job: dict) -> dict:
    """A removed job as its last row shows it: status Deleted."""
    return {**job, "status": "deleted", "replicas": []}


def watch_list(api: Api, team_id: str | None, first_page: Callable[[], list[dict]],
               output: Output, columns: tuple[Column, ...], row: Row, *,
               stream: TextIO | None = None) -> None:
    """Follow the team's jobs until Ctrl-C: list (after the stream is ready, so no
    change falls between), then every change."""
    shown = _Shown.of(output, columns, row, stream)
    table = JobTable()
    params = {"team_id": team_id} if team_id else {}
    try:
        with httpx.Client(base_url=f"{api.server}/api",
                          timeout=httpx.Timeout(30.0, connect=5.0)) as client:
            for attempt in range(RESUBSCRIBES + 1):
                for event, data in _events(client, api, "/jobs/events", params):
                    if event == "ready":
                        table.reset(first_page())
                        if attempt == 0 or shown.screen is not None:
                            shown.table(table)
                    elif event == "status":
                        changed = json.loads(data)
                        job = _get(client, api, changed["id"])
                        if job is None:
                            continue  # gone meanwhile: its `gone` follows
                        if table.put(job):
                            shown.change(job, table)
                    elif event == "gone":
                        removed = table.remove(json.loads(data)["id"])
                        if removed is not None:
                            shown.change(_gone_row(removed), table)
                    elif event == "lagged":
                        break
                else:
                    fail(f"the server at {api.server} ended the job stream", code=UNREACHABLE)
                if output.mode in ("table", "wide") and shown.screen is None:
                    err.print("following again (the server dropped the stream)")
            fail("the job stream kept falling behind", code=1)
    except httpx.TransportError as exc:
        fail(f"lost the job stream from {api.server}: {exc or type(exc).__name__}",
             code=UNREACHABLE)
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None


def watch_job(api: Api, job_id: str, output: Output, show: Callable[[dict], None],
              columns: tuple[Column, ...], row: Row, *,
              stream: TextIO | None = None) -> None:
    """Follow one job until it is gone (exit 0) or Ctrl-C: on a terminal ``show`` (the
    job's tables) redrawn in place; through a pipe one row per change."""
    stream = stream or sys.stdout
    shown = _Shown.of(output, columns, row, stream)
    path = f"/jobs/{quote(job_id, safe='')}/events"
    last: dict | None = None
    try:
        with httpx.Client(base_url=f"{api.server}/api",
                          timeout=httpx.Timeout(30.0, connect=5.0)) as client:
            for _ in range(RESUBSCRIBES + 1):
                for event, data in _events(client, api, path, {}):
                    if event == "job":
                        job = json.loads(data)
                        if job == last:
                            continue
                        if shown.screen is not None:
                            shown.screen.draw(_captured(show, job, stream))
                        elif last is None and output.mode in ("table", "wide"):
                            show(job, stream=stream)
                        else:
                            shown.change(job)
                        last = job
                    elif event == "gone":
                        if last is not None:
                            gone = _gone_row(last)
                            if shown.screen is not None:
                                shown.screen.draw(_captured(show, gone, stream))
                            else:
                                shown.change(gone)
                        err.print(f"job {job_id} is gone")
                        return
                    elif event == "lagged":
                        break
                else:
                    fail(f"the server at {api.server} ended job {job_id}'s stream",
                         code=UNREACHABLE)
            fail(f"job {job_id}'s stream kept falling behind", code=1)
    except httpx.TransportError as exc:
        fail(f"lost job {job_id}'s stream from {api.server}: {exc or type(exc).__name__}",
             code=UNREACHABLE)
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None


class _Capture:
    """A terminal-like stream that keeps what is written (``show``'s tables, laid out
    for the real terminal's width)."""

    def __init__(self, like: TextIO) -> None:
        self.like, self.parts = like, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.like.isatty()


def _captured(show: Callable[..., None], job: dict, like: TextIO) -> list[str]:
    capture = _Capture(like)
    show(job, stream=capture)
    return "".join(capture.parts).splitlines()
