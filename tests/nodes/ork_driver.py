"""What a test does to wrk-ork as app-node would, whether wrk-ork is a process
(``control_path.ControlPath``) or runs in the test's trio run (``cluster.Cluster``).

Both hold an RPC client of wrk-ork's service and a worker storage folder; the
calls, the waits and the VMI folders are the same over either.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from contracts.model import JobSpec
from contracts.ork import (
    CREATE_JOB,
    DELETE_JOB,
    GET_JOB,
    LIST_RACKS,
    CreateJob,
    Empty,
    JobRef,
    JobView,
)
from p2p.connection import Connection
from p2p.rpc import RpcClient, RpcError

__all__ = ["IMAGE", "OrkDriver", "container", "hold_client", "inference", "status"]

IMAGE = "docker://registry.example/cosmicac/ubuntu-cuda:12.4"


def container(name: str = "box", gpus: int = 1) -> JobSpec:
    return JobSpec(name=name, team="t1", type="container", image=IMAGE, gpus=gpus)


def inference(name: str = "chat", replicas: int = 1, gpus: int = 1) -> JobSpec:
    return JobSpec(name=name, team="t1", type="inference", image=IMAGE, gpus=gpus,
                   replicas=replicas, runtime="local", model="demo", served_name=name)


def status(name: str) -> Callable[[JobView | None], bool]:
    return lambda job: job is not None and job.status.value == name


async def hold_client(nursery: trio.Nursery, connection: Connection, protocol: str,
                      name: str) -> tuple[RpcClient, trio.CancelScope]:
    """An RPC client of ``protocol`` over ``connection``, held in ``nursery`` until
    the returned scope is cancelled."""
    scope = trio.CancelScope()
    clients: list[RpcClient] = []

    async def hold(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            async with trio.open_nursery() as inner:
                await inner.start(connection.run)
                channel = await connection.open_channel(protocol)
                clients.append(RpcClient(channel, name=name))
                await inner.start(clients[0].run)
                task_status.started()

    await nursery.start(hold)
    return clients[0], scope


class OrkDriver:
    """Calls on wrk-ork's service and waits on what they lead to.

    A subclass provides ``client`` (None while wrk-ork is down) and
    ``worker_storage``, and may say more on a failed wait (``failure_context``).
    """

    client: RpcClient | None
    worker_storage: Path

    def failure_context(self) -> str:
        """Text added to a failed wait's message (logs, say)."""
        return ""

    async def call(self, method, params, timeout_s: float = 10.0):
        assert self.client is not None, "wrk-ork is not running"
        return await self.client.call(method, params, timeout_s=timeout_s)

    async def create(self, spec: JobSpec) -> JobView:
        return (await self.call(CREATE_JOB, CreateJob(spec=spec))).job

    async def get(self, job_id: str) -> JobView:
        return (await self.call(GET_JOB, JobRef(job_id=job_id))).job

    async def delete(self, job_id: str) -> None:
        await self.call(DELETE_JOB, JobRef(job_id=job_id))

    async def wait_job(self, job_id: str, condition: Callable[[JobView | None], bool],
                       limit_s: float = 30.0) -> JobView | None:
        """Poll the job until ``condition`` holds (None: the job is gone)."""
        job: JobView | None = None
        with trio.move_on_after(limit_s):
            while True:
                try:
                    job = await self.get(job_id)
                except RpcError as exc:
                    if exc.code != "NOT_FOUND":
                        raise
                    job = None
                if condition(job):
                    return job
                await trio.sleep(0.1)
        raise AssertionError(f"job {job_id} never got there; last seen {job!r}"
                             f"{self.failure_context()}")

    async def wait_rack_reported(self, limit_s: float = 20.0) -> None:
        with trio.fail_after(limit_s):
            while True:
                racks = (await self.call(LIST_RACKS, Empty())).racks
                if racks and all(rack.reported and not rack.silent for rack in racks):
                    return
                await trio.sleep(0.05)

    def vmi_folders(self) -> list[Path]:
        root = self.worker_storage / "vmis"
        return sorted(path for path in root.iterdir() if path.is_dir()) if root.exists() else []
