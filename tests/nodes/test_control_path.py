"""The control path end to end: wrk-ork, a worker and its VMIs' agents.

wrk-ork and wrk-server-k8s-nvidia (2 nodes of 8 GPUs) run in the test's trio
run, each on its own host of an in-memory internet; each VMI is a real agent
there too (tests/nodes/cluster.py). The test holds the RPC client app-node
would hold. Conditions polled, every wait bounded. The same path over real
processes and sockets: tests/nodes/test_admission_daemons.py.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import trio

from contracts.agent_report import HELLO, Hello
from contracts.agent_report import PROTOCOL as AGENT_PROTOCOL
from contracts.ork import RESTART_JOB, JobRef
from p2p.rpc import RpcError

from .cluster import WORKER, cluster, container, inference, status

pytestmark = pytest.mark.slow


async def test_a_container_job_becomes_active_restarts_keeping_its_storage_and_is_deleted(
        tmp_path):
    with trio.fail_after(120):
        async with cluster(tmp_path) as path:
            job = await path.create(container(gpus=2))
            assert job.status.value in ("starting", "queued")
            await path.wait_job(job.id, status("active"))
            (folder,) = path.vmi_folders()
            disk = folder / "agent" / "storage"  # the agent's own folder in the VMI's
            identity = (disk / "identity").read_bytes()
            first_boot = path.agent_boot(folder)

            await path.call(RESTART_JOB, JobRef(job_id=job.id))
            restarted = await path.wait_job(
                job.id, lambda j: j is not None and j.status.value == "active"
                and j.replicas[0].generation == 1)
            assert restarted.replicas[0].generation == 1
            assert path.agent_boot(folder) != first_boot  # a new "VMI" ...
            assert (disk / "identity").read_bytes() == identity  # ... same disk
            # The worker's folder is its own, and no file of the worker
            # holds the agent's report token (only the agent's own config does).
            config = json.loads((folder / "agent" / "agent.json").read_text())
            token = config["report_token"]
            # A stolen token does not take the live VMI over (the real worker: the
            # agent's connection says it is alive).
            thief, scope = await path.connect(WORKER, path.worker_key,
                                               AGENT_PROTOCOL, "thief")
            with pytest.raises(RpcError) as info:
                await thief.call(HELLO, Hello(job_id=config["job_id"], replica=0,
                                              generation=config["generation"],
                                              node_rank=0, token=token))
            assert info.value.code == "ALREADY_BOUND"
            scope.cancel()
            assert stat.S_IMODE(path.worker_storage.stat().st_mode) == 0o700
            for file in path.worker_storage.rglob("*"):
                if file.is_file() and "agent" not in file.relative_to(folder.parent.parent).parts:
                    assert token.encode() not in file.read_bytes(), file
                if file.name.startswith("worker.sqlite"):
                    assert stat.S_IMODE(file.stat().st_mode) == 0o600, file

            await path.delete(job.id)
            await path.wait_job(job.id, lambda j: j is None)
            assert path.vmi_folders() == []


async def test_a_job_that_does_not_fit_is_pending_until_a_deletion_frees_gpus(tmp_path):
    with trio.fail_after(120):
        async with cluster(tmp_path) as path:
            first = await path.create(container("first", gpus=8))
            second = await path.create(container("second", gpus=8))
            await path.wait_job(first.id, status("active"))
            await path.wait_job(second.id, status("active"))
            third = await path.create(container("third", gpus=8))
            assert third.status.value == "pending"
            too_big = await path.create(container("too-big", gpus=9))
            assert too_big.status.value == "failed"
            assert "8" in too_big.reason
            await trio.sleep(1.0)
            assert (await path.get(third.id)).status.value == "pending"
            await path.delete(first.id)
            await path.wait_job(third.id, status("active"))


async def test_a_worker_killed_mid_operation_loses_no_operation(tmp_path):
    # "Killed": its tasks cancelled at once, wherever they are (the harness's
    # stand-in for SIGKILL; its files are what it wrote).
    with trio.fail_after(300):
        async with cluster(tmp_path) as path:
            await path.kill_worker()  # operations published while it is down wait in the queue
            job = await path.create(container("while-down"))
            await path.start_worker()
            await path.wait_job(job.id, status("active"), limit_s=90)

            # Killed right after a restart was asked: the worker may have the
            # operation, have acked it, or be in the middle of stopping the agent.
            for delay in (0.0, 0.3):
                generation = (await path.get(job.id)).replicas[0].generation
                await path.call(RESTART_JOB, JobRef(job_id=job.id))
                await trio.sleep(delay)
                await path.kill_worker()
                await path.start_worker()
                await path.wait_job(job.id, lambda j, g=generation: j is not None
                                    and j.status.value == "active"
                                    and j.replicas[0].generation == g + 1, limit_s=90)
            assert len(path.vmi_folders()) == 1


async def test_killing_an_agent_degrades_a_two_replica_job_and_fails_a_one_replica_job(
        tmp_path):
    # The agents serve no model (ready at once): what a replica's status does
    # when its agent dies is the worker's and wrk-ork's, whatever the agent ran.
    # A model server behind the agent: proxy_inference/test_end_to_end.py.
    with trio.fail_after(120):
        async with cluster(tmp_path, workload=lambda config: None) as path:
            pair = await path.create(inference("pair", replicas=2))
            single = await path.create(inference("single", replicas=1))
            await path.wait_job(pair.id, status("active"))
            await path.wait_job(single.id, status("active"))
            short = pair.id.removeprefix("j-")
            pair_folder = next(f for f in path.vmi_folders() if short in f.name)
            single_folder = next(f for f in path.vmi_folders()
                                 if single.id.removeprefix("j-") in f.name)
            await path.kill_agent(pair_folder)
            await path.kill_agent(single_folder)
            degraded = await path.wait_job(pair.id, status("degraded"))
            assert sorted(r.status.value for r in degraded.replicas) == ["active", "failed"]
            await path.wait_job(single.id, status("failed"))


async def test_wrk_ork_killed_mid_operation_keeps_its_jobs_and_loses_no_report(tmp_path):
    with trio.fail_after(150):
        async with cluster(tmp_path) as path:
            await path.kill_worker()  # again, reporting every 0.4 s
            await path.start_worker(report_interval_s=0.4)
            running = await path.create(container("running"))
            await path.wait_job(running.id, status("active"))
            fresh = await path.create(container("fresh"))
            await path.kill_ork()  # its create may be in the outbox, the queue, or applied
            # The worker goes on for a report interval: reports made while wrk-ork
            # is down wait in its queue.
            await trio.sleep(0.4)
            await path.start_ork()
            await path.wait_job(fresh.id, status("active"))
            assert (await path.get(running.id)).status.value == "active"
            await path.delete(running.id)
            await path.kill_ork()
            await path.start_ork()
            await path.wait_job(running.id, lambda j: j is None)
            assert len(path.vmi_folders()) == 1


async def test_a_silent_worker_makes_its_jobs_unknown_until_it_reports_again(tmp_path):
    # The worker reports every 0.4 s, and wrk-ork marks the jobs of a worker
    # silent for 1 s (twice and a half that interval) unknown.
    reporting = {"report_interval_s": 0.4}
    with trio.fail_after(120):
        async with cluster(tmp_path) as path:
            await path.kill_worker()
            await path.kill_ork()
            await path.start_ork(unknown_after_s=1.0)
            await path.start_worker(**reporting)
            job = await path.create(container("watched"))
            await path.wait_job(job.id, status("active"))
            await path.kill_worker()
            unknown = await path.wait_job(job.id, status("unknown"), limit_s=20)
            assert "no report" in unknown.reason
            await path.start_worker(**reporting)  # the agent kept running, as a VMI would
            await path.wait_job(job.id, status("active"), limit_s=30)


async def test_a_models_and_its_jobs_server_settings_reach_the_model_server(tmp_path):
    """The model master's arguments and environment, then the job's, from the spec
    through the worker's agent config to the model server's own command line."""
    import httpx

    from contracts.runtime_settings import ModelRuntimeSettings, RuntimeSettings

    spec = inference("tuned").model_copy(update={
        "model_settings": ModelRuntimeSettings(args=("--max-model-len", "512"),
                                               env={"CAC_FROM_MASTER": "m"}),
        "runtime_settings": RuntimeSettings(args=("--max-model-len", "64"),
                                            env={"CAC_FROM_JOB": "j"})})
    with trio.fail_after(120):
        async with cluster(tmp_path) as path:
            job = await path.create(spec)
            await path.wait_job(job.id, status("active"))
            _, argv, environ = await trio.to_thread.run_sync(_model_server, "tuned")
            assert argv[-4:] == ["--max-model-len", "512", "--max-model-len", "64"]
            assert b"CAC_FROM_MASTER=m" in environ and b"CAC_FROM_JOB=j" in environ
            port = argv[argv.index("--port") + 1]
            async with httpx.AsyncClient(trust_env=False) as http:
                models = (await http.get(f"http://127.0.0.1:{port}/v1/models")).json()
            assert models["data"][0]["max_model_len"] == 64  # the job's value won
            await path.delete(job.id)
            await path.wait_job(job.id, lambda j: j is None)


def _model_server(served_name: str) -> tuple[int, list[str], list[bytes]]:
    """The model server child of this process serving ``served_name`` (not one of a
    suite running beside this one): pid, command line, environment."""
    from runtime.process import cmdline

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_text = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat_text[stat_text.rindex(")") + 2:].split()[1])
        argv = cmdline(int(entry.name))
        if parent == os.getpid() and "--served-name" in argv \
                and argv[argv.index("--served-name") + 1] == served_name:
            found.append((int(entry.name), argv, environ))
    (server,) = found
    return server
