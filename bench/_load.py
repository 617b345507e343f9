"""Load generators for the HTTP benchmarks: ``wrk`` for request/response load, a
small trio client for streamed (SSE) responses.

Why ``wrk``: the servers under test are single Python processes; a Python load
generator on the same two cores would cost as much CPU per request as they do
and cap the figures. ``wrk`` (C, one thread, epoll) spends a few µs per
request, keeps its connections alive, and its Lua ``done`` hook reports exact
percentiles from its own histogram (µs resolution), which we print as JSON.

Why a Python client for streams: ``wrk`` times whole responses and cannot see
the first chunk. A stream is long (dozens of SSE events) so the client's cost
per byte, not per request, matters, and counting ``data: `` lines in bytes
read off a raw socket is far cheaper than what the servers do per event.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

__all__ = [
    "LoadError",
    "StreamResult",
    "WrkResult",
    "children",
    "cpu_seconds",
    "ensure_wrk",
    "http_get_status",
    "post_status",
    "run_streams",
    "run_wrk",
]


class LoadError(RuntimeError):
    """The load generator could not run or the server answered wrongly."""


# --- processes' CPU ---

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # fields from the 3rd on (comm may hold spaces)


def cpu_seconds(pids: tuple[int, ...] | list[int]) -> float:
    """User + system CPU the processes used so far (Linux ``/proc``; 0 for a gone one)."""
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS


def children(pid: int, *, argv_contains: str = "") -> list[int]:
    """The pids whose parent is ``pid`` and whose command line holds
    ``argv_contains`` (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is None or int(fields[1]) != pid:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if argv_contains in argv:
            found.append(int(entry.name))
    return found


# --- wrk ---


def ensure_wrk() -> str:
    """The path of ``wrk``, installed with apt-get (Debian package ``wrk``) if missing."""
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() != 0:
        raise LoadError("wrk is not installed and we are not root: apt-get install wrk")
    for command in (["apt-get", "install", "-y", "-q", "wrk"],
                    ["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "wrk"]):
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600)
        found = shutil.which("wrk")
        if found:
            return found
    raise LoadError("apt-get install wrk failed")


# The request is fixed at load time; ``done`` prints one JSON line that we parse.
_LUA = """
wrk.method = {method}
{body}
{auth}
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRKJSON {{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"mean_us": %.1f, "max_us": %d}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(99), latency.mean,
    latency.max))
end
"""


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid Lua string literal for ASCII


@dataclass(frozen=True)
class WrkResult:
    requests: int
    duration_s: float
    errors: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    #: wrk's own CPU (user + system) over the run's wall time, in cores: well
    #: below 1 means the load generator was not what limited the rate.
    cpu_cores: float

    @property
    def rate(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0


# A smoke run's cap: the thread stops sending and says so on stdout; once every
# thread has, :func:`_wrk_until_answered` ends wrk (SIGINT: it reports as at -d).
_STOPPED = "WRKSTOPPED"
_STOP_AFTER = """
local answered = 0
response = function(status, headers, body)
  answered = answered + 1
  if answered == {limit} then io.write("\\n{stopped}\\n"); io.flush() end
  if answered >= {limit} then wrk.thread:stop() end
end
"""


def _wrk_until_answered(argv: list[str], threads: int, timeout_s: float) -> tuple[int, str, str]:
    """Run wrk (a smoke run: ``_STOP_AFTER`` in its script) and interrupt it once each
    of its ``threads`` has its answers, instead of idling to the end of ``-d``: wrk's
    SIGINT handler ends the run, and it reports the requests and the time so far.
    wrk installs that handler before it prints its "Running" line, so the signal is
    sent only after that line; a run where some thread never gets its answers (errors)
    still ends at ``-d``. Killed after ``timeout_s``. Returns (exit code, stdout, stderr)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            lines: list[str] = []
            running, stopped, interrupted = False, 0, False
            for line in proc.stdout:
                lines.append(line)
                running = running or line.startswith("Running ")
                stopped += line.strip() == _STOPPED
                if running and stopped >= threads and not interrupted:
                    proc.send_signal(signal.SIGINT)
                    interrupted = True
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        return proc.returncode, "".join(lines), err.read()


# Bearer tokens taken in turn, one per request (many users' sessions).
_ROTATE = """
local tokens = {{{tokens}}}
local turn = 0
request = function()
  turn = turn + 1
  wrk.headers["Authorization"] = "Bearer " .. tokens[(turn % #tokens) + 1]
  return wrk.format()
end
"""


def run_wrk(
    url: str,
    body: dict[str, Any] | None,
    *,
    api_key: str | None,
    connections: int,
    duration_s: float,
    threads: int = 1,
    method: str = "POST",
    bearers: Sequence[str] = (),
    max_requests: int | None = None,
) -> WrkResult:
    """Send ``method`` (``body`` as JSON, None: no body) to ``url`` for
    ``duration_s`` over ``connections`` kept-alive connections (each one request
    at a time: closed loop). ``bearers``: tokens sent in turn, one per request,
    instead of the one ``api_key``.

    ``max_requests``: each wrk thread stops sending after that many answers, and wrk
    is ended once every thread has them (a smoke run: every figure is printed, and
    the run lasts as long as those answers take, at most ``duration_s``; rates and
    CPU per request over so few requests mean nothing)."""
    wrk = ensure_wrk()
    if bearers:
        auth = _ROTATE.format(tokens=", ".join(_lua_string(t) for t in bearers))
    elif api_key:
        auth = f'wrk.headers["Authorization"] = {_lua_string("Bearer " + api_key)}'
    else:
        auth = ""
    lua_body = "" if body is None else (
        f"wrk.body = {_lua_string(json.dumps(body, separators=(',', ':')))}\n"
        'wrk.headers["Content-Type"] = "application/json"')
    script = _LUA.format(method=_lua_string(method), body=lua_body, auth=auth)
    if max_requests is not None:
        script += _STOP_AFTER.format(limit=max(1, max_requests), stopped=_STOPPED)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
        path = handle.name
    try:
        seconds = max(1, round(duration_s))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        argv = [wrk, f"-t{min(threads, connections)}", f"-c{connections}", f"-d{seconds}s",
                "--timeout", "10s", "-s", path, url]
        if max_requests is None:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60,
                                  check=False)
            returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        else:
            returncode, stdout, stderr = _wrk_until_answered(
                argv, min(threads, connections), seconds + 60)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        Path(path).unlink(missing_ok=True)
    line = next((x for x in stdout.splitlines() if x.startswith("WRKJSON ")), None)
    if returncode != 0 or line is None:
        raise LoadError(f"wrk failed ({returncode}): {stderr.strip() or stdout}")
    raw = json.loads(line.removeprefix("WRKJSON "))
    errors = sum(raw[k] for k in ("connect", "read", "write", "status", "timeout"))
    return WrkResult(
        requests=raw["requests"],
        duration_s=raw["duration_us"] / 1e6,
        errors=errors,
        p50_ms=raw["p50_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        mean_ms=raw["mean_us"] / 1000,
        cpu_cores=(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / wall,
    )


# --- streams ---


@dataclass
class StreamResult:
    streams: int = 0
    chunks: int = 0
    elapsed_s: float = 0.0
    ttfc_ms: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.elapsed_s if self.elapsed_s else 0.0


def _request_bytes(host: str, port: int, path: str, body: bytes, api_key: str | None) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
    ]
    if api_key:
        head.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _one_stream(stream: trio.SocketStream, request: bytes, result: StreamResult) -> None:
    """Send one request on a kept-alive connection, read its chunked SSE answer."""
    started = time.perf_counter()
    await stream.send_all(request)
    buf = bytearray()
    header_end = -1
    first_seen = False
    while True:
        data = await stream.receive_some(65536)
        if not data:
            raise LoadError("the server closed the connection mid-stream")
        buf += data
        if header_end < 0:
            header_end = buf.find(b"\r\n\r\n")
            if header_end < 0:
                continue
            status = bytes(buf[: buf.find(b"\r\n")])
            if b" 200 " not in status + b" ":
                raise LoadError(f"stream answered {status.decode(errors='replace')}")
            if b"transfer-encoding: chunked" not in bytes(buf[:header_end]).lower():
                raise LoadError("a streamed answer that is not chunked")
        if not first_seen and buf.find(b"data: ", header_end) >= 0:
            first_seen = True
            result.ttfc_ms.append((time.perf_counter() - started) * 1000)
        if buf.endswith(b"\r\n0\r\n\r\n"):
            break
    if b"[DONE]" not in buf:
        raise LoadError("a stream ended without data: [DONE]")
    # Count events, not the [DONE] marker: what a client turns into tokens.
    result.chunks += buf.count(b"data: ", header_end) - 1
    result.streams += 1


async def _stream_worker(host: str, port: int, request: bytes, count: int,
                         result: StreamResult, deadline: float) -> None:
    stream = await trio.open_tcp_stream(host, port)
    try:
        for _ in range(count):
            if trio.current_time() > deadline:
                break
            try:
                await _one_stream(stream, request, result)
            except LoadError:
                result.errors += 1
                await stream.aclose()
                stream = await trio.open_tcp_stream(host, port)
    finally:
        await stream.aclose()


async def run_streams(host: str, port: int, path: str, body: dict[str, Any], *,
                      api_key: str | None, clients: int, streams: int,
                      time_limit_s: float = 120.0) -> StreamResult:
    """Run ``streams`` streamed requests over ``clients`` kept-alive connections;
    chunks/s is over the wall time of the whole batch."""
    request = _request_bytes(host, port, path, json.dumps(body).encode(), api_key)
    result = StreamResult()
    began = time.perf_counter()
    deadline = trio.current_time() + time_limit_s
    with trio.move_on_after(time_limit_s + 10):
        async with trio.open_nursery() as nursery:
            for index in range(clients):
                share = streams // clients + (1 if index < streams % clients else 0)
                nursery.start_soon(_stream_worker, host, port, request, share, result, deadline)
    result.elapsed_s = time.perf_counter() - began
    return result


async def post_status(host: str, port: int, path: str, body: dict[str, Any],
                      api_key: str | None = None, timeout_s: float = 30.0) -> int:
    """The status of one ``POST path`` (Connection: close), or 0 if nothing
    answers within ``timeout_s``: used to wait until a server has worked off
    the requests a finished load run left queued in it."""
    request = _request_bytes(host, port, path, json.dumps(body).encode(), api_key)
    request = request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
    data = b""
    with trio.move_on_after(timeout_s):
        try:
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                await stream.send_all(request)
                while more := await stream.receive_some(65536):
                    data += more
        except OSError:
            return 0
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


async def http_get_status(host: str, port: int, path: str, api_key: str | None = None) -> int:
    """The status of ``GET path`` (Connection: close), or 0 if nothing answers."""
    head = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    try:
        with trio.fail_after(5):
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                await stream.send_all((head + "\r\n").encode())
                data = b""
                while b"\r\n" not in data:
                    more = await stream.receive_some(4096)
                    if not more:
                        return 0
                    data += more
    except (OSError, trio.TooSlowError):
        return 0
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0
