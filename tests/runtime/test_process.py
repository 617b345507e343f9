"""The process helper the three supervisors share: spawn, stop, describe_exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import trio

from runtime.process import describe_exit, spawn, stop

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
    "print('ready', flush=True); time.sleep(60)"


@pytest.mark.parametrize(("code", "words"), [
    (0, "exited with status 0"), (3, "exited with status 3"),
    (-signal.SIGKILL, "killed by SIGKILL"), (-signal.SIGTERM, "killed by SIGTERM"),
    (-77, "killed by signal 77"), (None, "exited with an unknown status"),
])
def test_an_exit_is_described_in_words(code: int | None, words: str) -> None:
    assert describe_exit(code) == words


async def test_a_spawned_child_leads_a_group_of_its_own_and_stops_on_term() -> None:
    process = await spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert os.getpgid(process.pid) == process.pid != os.getpgid(0)
    finally:
        with trio.fail_after(20):
            await stop(process, grace_s=10)
    assert describe_exit(process.returncode) == "killed by SIGTERM"


@pytest.mark.parametrize("group", [True, False])
async def test_a_child_that_ignores_term_is_killed_after_the_grace(group: bool) -> None:
    process = await spawn([sys.executable, "-c", IGNORES_TERM], new_session=group,
                          stdout=subprocess.PIPE)
    assert process.stdout is not None
    with trio.fail_after(20):
        await process.stdout.receive_some(16)  # its handler is in place
        await stop(process, grace_s=0.2, group=group)
    assert describe_exit(process.returncode) == "killed by SIGKILL"
