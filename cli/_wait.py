"""``--wait`` for job commands: poll ``GET /api/jobs/{id}`` until the job is running
(or gone), showing progress on stderr, never on stdout.

stdout stays what the command printed (a job id, a JSON document) so that
``JOB=$(cosmicac jobs create ... --wait)`` works; progress goes to stderr: a live
status line (job status, each replica's status and message, elapsed) when stderr
is a terminal, else one line per change, which reads well in CI logs.

The decisions are a small pure core (:func:`judge`, :func:`summary`) and a thin
synchronous driver (:func:`wait_for`): the CLI is synchronous httpx, one request
at a time, and polling needs no concurrency.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import httpx
from rich.status import Status
from rich.text import Text

from ._console import err, fail
from .session import REFUSED, UNREACHABLE, Api

__all__ = ["DEFAULT_TIMEOUT_S", "Goal", "Outcome", "judge", "summary", "wait_for"]

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
        self.status: Status | None = Status(Text(f"waiting for job {job_id}"), console=err)
        self.status.start()
        self.last = ""

    def show(self, line: str, elapsed: float) -> None:
        if self.status is None:
            return
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


def wait_for(api: Api, job_id: str, goal: Goal, timeout_s: float, *,
             tty: bool | None = None, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> dict[str, Any] | None:
    """Poll the job until ``goal``; return its last document (None when gone).

    Exits 1 when the job failed (with its reason) or when ``timeout_s`` passed
    (saying so, and that the job itself goes on), 130 on Ctrl-C.
    """
    start = clock()
    deadline = start + timeout_s
    interactive = err.is_terminal if tty is None else tty
    display: _Display = _Live(job_id, goal) if interactive else _Lines(job_id)
    interval, last = FIRST_INTERVAL_S, None
    try:
        with httpx.Client(base_url=f"{api.server}/api",
                          timeout=httpx.Timeout(30.0, connect=5.0)) as client:
            poller = _Poller(api, client, job_id)
            while True:
                job = poller.get()
                line = summary(job)
                display.show(line, clock() - start)
                outcome, why = judge(job, goal)
                if outcome is Outcome.DONE:
                    return job
                if outcome is Outcome.FAILED:
                    display.close()
                    fail(why, code=REFUSED)
                now = clock()
                if now >= deadline:
                    display.close()
                    fail(f"timed out after {timeout_s:g}s waiting for job {job_id} to be "
                         f"{goal.value} (it is {line}); the job goes on: see "
                         f"`cosmicac jobs get {job_id}`, or wait longer with --timeout",
                         code=REFUSED)
                interval = FIRST_INTERVAL_S if line != last else min(interval * 1.5,
                                                                      MAX_INTERVAL_S)
                last = line
                sleep(min(interval, deadline - now))
    except KeyboardInterrupt:
        display.close()
        fail(f"stopped waiting; job {job_id} goes on (see `cosmicac jobs get {job_id}`)",
             code=INTERRUPTED)
    finally:
        display.close()
