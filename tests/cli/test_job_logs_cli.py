"""``cosmicac jobs logs`` (run in this process) against an in-process app-node, wrk-ork
and wrk-monitor (``served_logs``): the job's records one line each (``-o json``: JSON
lines), filtered by --source; ``-f`` (a real process: the ``jobs`` group's smoke test)
prints a record appended after it connected and exits 130 on Ctrl-C; an unknown job
exits 1; without wrk-monitor, 1 with the server's message."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
import trio

from contracts.monitor import APPLICATION, make_record
from tests.cli.helpers import COSMICAC, kill_if_running

from .support import ServedOrk, one_error_line

pytestmark = pytest.mark.slow

IMAGE = "docker://registry.local/jobs/app:1"


def _append(served: ServedOrk, job: str, text: str, source: str = "System") -> None:
    assert served.log_buffer is not None
    served.log_buffer.append([make_record(text, service="agent-inference", source=source,
                                          job_id=job, replica=0)])


async def _job(served: ServedOrk) -> str:
    await served.login()
    created = await served.cli("jobs", "create", "--name", "box", "--type", "container",
                               "--image", IMAGE)
    assert created.returncode == 0, created.stderr
    return created.stdout.decode().strip()


async def test_logs_print_follow_and_stop(served_logs: ServedOrk) -> None:
    served = served_logs
    with trio.fail_after(120):
        job = await _job(served)
        _append(served, job, "pulling the image")
        _append(served, job, "GET /v1/models 200", source=APPLICATION)

        shown = await served.cli("jobs", "logs", job)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.decode().splitlines()
        assert len(lines) == 2
        assert lines[0].endswith("  system       agent-inference  [0]  pulling the image")
        assert lines[1].split("  ")[-1] == "GET /v1/models 200"

        as_json = await served.cli("jobs", "logs", job, "--source", "application", "-o", "json")
        assert as_json.returncode == 0, as_json.stderr
        [record] = [json.loads(line) for line in as_json.stdout.decode().splitlines()]
        assert record["text"] == "GET /v1/models 200" and record["source"] == "application"

        missing = await served.cli("jobs", "logs", "no-such-job")
        assert missing.returncode == 1 and "no job no-such-job" in one_error_line(missing)
        bad = await served.cli("jobs", "logs", job, "--source", "kernel")
        assert bad.returncode == 2

        process = await trio.lowlevel.open_process(
            [*COSMICAC, "jobs", "logs", job, "-f", "--source", "system"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=served.env)
        try:
            assert process.stdout is not None
            seen = b""

            async def until(text: bytes) -> None:
                nonlocal seen
                while text not in seen:  # bounded by fail_after
                    chunk = await process.stdout.receive_some(4096)
                    assert chunk, "the follow ended"
                    seen += chunk

            await until(b"pulling the image")
            _append(served, job, "model loaded")
            await until(b"model loaded")
            assert b"GET /v1/models" not in seen
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 130
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(60):
                await kill_if_running(process)


async def test_without_wrk_monitor_it_says_so(served_ork: ServedOrk) -> None:
    served = served_ork
    with trio.fail_after(120):
        job = await _job(served)
        for follow in ((), ("-f",)):
            started = time.monotonic()
            result = await served.cli("jobs", "logs", job, *follow)
            assert result.returncode == 1, result.stderr
            assert "wrk-monitor is not configured" in one_error_line(result)
            assert time.monotonic() - started < 60
