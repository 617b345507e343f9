"""Admission end to end: a stranger floods wrk-ork and the worker
(real ``cosmicac run`` processes on 127.0.0.1) with silent sockets and
self-made keys, and holds on; a new job's agent still reaches its worker and
the job becomes Active, and wrk-ork's configured client is still served.

Before the fix 70 silent sockets filled the handshake slots and 64 keys the
connection slots, for as long as the client held on. Real time, every wait
bounded, no timed assert (bench/admission.py measures how fast).
"""

from __future__ import annotations

import pytest
import trio

from contracts.ork import LIST_RACKS, Empty
from tests.flood import flood

from .control_path import control_path
from .ork_driver import container, status

pytestmark = pytest.mark.slow


async def test_a_new_jobs_agent_reaches_its_worker_while_a_stranger_holds_on(tmp_path):
    with trio.fail_after(150):
        async with control_path(tmp_path) as path, trio.open_nursery() as attacker:
            # Both at once: each sets up 134 sockets one after another, and the
            # second one's set-up used to run under the first's churn (evicted keys
            # dialling again) alone.
            async with trio.open_nursery() as flooding:
                flooding.start_soon(flood, attacker, path.worker_port, path.worker_key)
                flooding.start_soon(flood, attacker, path.ork_port, path.ork_key)
            job = await path.create(container(gpus=1))
            await path.wait_job(job.id, status("active"), limit_s=120)
            assert (await path.call(LIST_RACKS, Empty())).racks  # app-node's calls go on
            attacker.cancel_scope.cancel()
