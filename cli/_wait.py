"""``--wait`` for job commands: follow the job's events (``GET /api/jobs/{id}/events``,
server-sent events), or poll ``GET /api/jobs/{id}`` where the server does not offer
them, until the job is running (or gone), showing progress on stderr, never on stdout.

stdout stays what the command printed (a job id, a JSON document) so that
``JOB=$(cosmicac jobs create ... --wait)`` works; progress goes to stderr: a live
status line (job status, each replica's status and message, elapsed) when stderr
is a terminal, else one line per change, which reads well in CI logs.

The decisions are a small pure core (:func:`judge`, :func:`summary`,
:func:`runtime.sse.sse_events`) and a thin synchronous driver (:func:`wait_for`): the CLI is
synchronous httpx, one request at a time, and neither following nor polling needs
concurrency. The stream's reads are bounded by what is left of ``--timeout`` (and
by :data:`STREAM_SILENCE_S`: no keep-alive that long means a broken stream), so
the timeout holds as when polling. The stream falls back to polling on any answer
but a 200 event stream (404/405 from a server without it, 503 without wrk-ork;
the poll then reports a real error as before), on a broken connection, or on an
end without ``gone``/``lagged``; ``lagged`` subscribes again (the stream starts
with the current document, so nothing is missed).
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from runtime.sse import sse_events

from ._console import err, fail, stderr_console
from .session import REFUSED, UNREACHABLE, Api

if TYPE_CHECKING:  # imported where used: `jobs list` and `get` load neither
    import httpx
    from rich.status import Status

__all__ = ["DEFAULT_TIMEOUT_S", "Goal", "Outcome", "judge", "sse_events", "summary",
           "wait_for"]

#: How long ``--wait`` waits unless ``--timeout`` says otherwise: a model's first
#: download and load can take minutes.
DEFAULT_TIMEOUT_S = 600.0
#: Polling starts fast (the local backend starts jobs in about a second) and slows
#: down while nothing changes; it is fast again after each change.
FIRST_INTERVAL_S, MAX_INTERVAL_S = 0.25, 2.0
#: Exit code of a wait interrupted by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130


class Goal(enum.StrEnum):
    #: Wait until the job's status is ``running`` (Active).
    RUNNING = "running"
    #: Wait until wrk-ork has removed it (the API answers 404).
    GONE = "gone"


class Outcome(enum.Enum):
    WAIT = "wait"
    DONE = "done"
    FAILED = "failed"


def _why_failed(job: dict[str, Any]) -> str:
    """The job's reason, else its failed replicas' messages, else a pointer."""
    if job.get("reason"):
        return str(job["reason"])
    messages = [f"replica {r['index']}: {r['message']}" for r in job.get("replicas", ())
                if r.get("status") == "failed" and r.get("message")]
    return "; ".join(messages) or "no reason given"


def judge(job: dict[str, Any] | None, goal: Goal) -> tuple[Outcome, str]:
    """Whether waiting for ``goal`` is over, given the job now (None: it is gone).

    For RUNNING, ``failed`` ends the wait with the job's reason and a job being
    deleted can never get there; ``degraded`` and ``unknown`` may still recover,
    so they are waited out (``--timeout`` bounds it). For GONE, only the 404 ends it.
    """
    if goal is Goal.GONE:
        return (Outcome.DONE, "gone") if job is None else (Outcome.WAIT, "")
    if job is None:
        return Outcome.FAILED, "the job was deleted while waiting for it to run"
    status = job["status"]
    if status == "running":
        return Outcome.DONE, status
    if status == "failed":
        return Outcome.FAILED, f"job {job['id']} failed: {_why_failed(job)}"
    if status == "deleting":
        return Outcome.FAILED, f"job {job['id']} is being deleted: it will not run"
    return Outcome.WAIT, ""


def summary(job: dict[str, Any] | None) -> str:
    """One line: the job's status, then each replica's status and message."""
    if job is None:
        return "gone"
    parts = [str(job["status"])]
    for replica in job.get("replicas", ()):
        text = f"replica {replica['index']} {replica['status']}"
        if replica.get("message"):
            text += f" ({replica['message']})"
        parts.append(text)
    return " · ".join(parts)


class _Display(Protocol):
    def show(self, line: str, elapsed: float) -> None: ...
    def close(self) -> None: ...


class _Lines:
    """Not a terminal: one line per change, with the seconds since the start."""

    def __init__(self, job_id: str) -> None:
        self.job_id, self.last = job_id, ""

    def show(self, line: str, elapsed: float) -> None:
        if line != self.last:
            self.last = line
            err.print(f"[{elapsed:5.1f}s] job {self.job_id}: {line}")

    def close(self) -> None:
        pass


class _Live:
    """A terminal: one status line, redrawn in place, with the elapsed time."""

    def __init__(self, job_id: str, goal: Goal) -> None:
        self.job_id, self.goal = job_id, goal
        from rich.status import Status
        from rich.text import Text

        self.status: Status | None = Status(Text(f"waiting for job {job_id}"),
                                            console=stderr_console())
        self.status.start()
        self.last = ""

    def show(self, line: str, elapsed: float) -> None:
        if self.status is None:
            return
        from rich.text import Text

        self.status.update(Text(f"job {self.job_id} → {self.goal.value} "
                                f"[{elapsed:.0f}s]: {line}"))
        if line != self.last:
            # Kept above the live line: what a replica said may matter afterwards.
            self.status.console.print(Text(f"[{elapsed:5.1f}s] {line}", style="dim"))
            self.last = line

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


@dataclass
class _Poller:
    """GET the job; None once the API says it does not exist (404)."""

    api: Api
    client: httpx.Client
    job_id: str

    def get(self) -> dict[str, Any] | None:
        import httpx

        headers = {"authorization": f"Bearer {self.api.token}"} if self.api.token else {}
        try:
            response = self.client.get(f"/jobs/{quote(self.job_id, safe='')}",
                                       headers=headers)
        except httpx.TransportError as exc:
            fail(f"lost the server at {self.api.server} while waiting for job "
                 f"{self.job_id}: {exc or type(exc).__name__}", code=UNREACHABLE)
        if response.status_code == 404:
            return None
        if not response.is_success:
            self.api._fail(response)  # the CLI's one line and exit code
        return response.json()


class _NoStream(Exception):
    """The job's event stream is not offered (an older server, an error answer) or
    broke: poll instead."""


#: Longest silence on the event stream before it counts as broken: the server
#: sends a keep-alive every 15 s.
STREAM_SILENCE_S = 25.0
#: Times the stream is subscribed again after the server said ``lagged``.
MAX_RESUBSCRIBES = 20


@dataclass
class _Wait:
    """One wait's state and its decisions, shared by following and polling."""

    job_id: str
    goal: Goal
    timeout_s: float
    display: _Display
    clock: Callable[[], float]
    start: float
    line: str = ""

    @property
    def deadline(self) -> float:
        return self.start + self.timeout_s

    def see(self, job: dict[str, Any] | None) -> bool:
        """Show ``job``; True when the goal is reached; exits 1 when it never will be."""
        self.line = summary(job)
        self.display.show(self.line, self.clock() - self.start)
        outcome, why = judge(job, self.goal)
        if outcome is Outcome.FAILED:
            self.display.close()
            fail(why, code=REFUSED)
        return outcome is Outcome.DONE

    def check_time(self) -> None:
        """Exit 1 (saying the job goes on) once the timeout has passed."""
        if self.clock() >= self.deadline:
            self.display.close()
            fail(f"timed out after {self.timeout_s:g}s waiting for job {self.job_id} to be "
                 f"{self.goal.value} (it is {self.line}); the job goes on: see "
                 f"`cosmicac jobs get {self.job_id}`, or wait longer with --timeout",
                 code=REFUSED)


def _follow(api: Api, client: httpx.Client, wait: _Wait) -> dict[str, Any] | None:
    """Follow ``GET /api/jobs/{id}/events`` until the goal; the last document.

    Raises:
        _NoStream: not offered, or broken: the caller polls.
    """
    import httpx

    headers = {"authorization": f"Bearer {api.token}"} if api.token else {}
    path = f"/jobs/{quote(wait.job_id, safe='')}/events"
    for _ in range(MAX_RESUBSCRIBES + 1):
        # Reads wait at most until the deadline: a timeout is never overshot by
        # more than a keep-alive's interval, and reopening (below) removes that too.
        read_s = max(0.01, min(STREAM_SILENCE_S, wait.deadline - wait.clock()))
        timeout = httpx.Timeout(30.0, connect=5.0, read=read_s)
        try:
            with client.stream("GET", path, headers=headers, timeout=timeout) as response:
                kind = response.headers.get("content-type", "")
                if response.status_code != 200 or not kind.startswith("text/event-stream"):
                    raise _NoStream
                reopen = False
                for event, data in sse_events(response.iter_lines()):
                    if event == "job":
                        job = json.loads(data)
                        if wait.see(job):
                            return job
                    elif event == "gone":
                        if wait.see(None):
                            return None
                    elif event == "lagged":
                        reopen = True
                        break
                    wait.check_time()
                    if not event and wait.clock() + read_s > wait.deadline + 0.5:
                        reopen = True  # again with reads bounded by what is left
                        break
                if not reopen:
                    raise _NoStream  # ended without saying why
        except httpx.ReadTimeout:
            wait.check_time()
            raise _NoStream from None
        except (httpx.TransportError, ValueError):
            raise _NoStream from None
    raise _NoStream


def wait_for(api: Api, job_id: str, goal: Goal, timeout_s: float, *,
             tty: bool | None = None, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic,
             follow: bool = True) -> dict[str, Any] | None:
    """Wait until ``goal``; return the job's last document (None when gone).

    Follows the job's event stream (``follow``) where the server offers it, else
    (an older server, an error answer, a broken stream) polls the job.
    Exits 1 when the job failed (with its reason) or when ``timeout_s`` passed
    (saying so, and that the job itself goes on), 130 on Ctrl-C.
    """
    import httpx

    interactive = err.is_terminal if tty is None else tty
    display: _Display = _Live(job_id, goal) if interactive else _Lines(job_id)
    wait = _Wait(job_id, goal, timeout_s, display, clock, clock())
    interval, last = FIRST_INTERVAL_S, None
    try:
        with httpx.Client(base_url=f"{api.server}/api",
                          timeout=httpx.Timeout(30.0, connect=5.0)) as client:
            if follow:
                try:
                    return _follow(api, client, wait)
                except _NoStream:
                    pass
            poller = _Poller(api, client, job_id)
            while True:
                job = poller.get()
                if wait.see(job):
                    return job
                wait.check_time()
                interval = FIRST_INTERVAL_S if wait.line != last else min(interval * 1.5,
                                                                           MAX_INTERVAL_S)
                last = wait.line
                sleep(min(interval, wait.deadline - clock()))
    except KeyboardInterrupt:
        display.close()
        fail(f"stopped waiting; job {job_id} goes on (see `cosmicac jobs get {job_id}`)",
             code=INTERRUPTED)
    finally:
        display.close()
