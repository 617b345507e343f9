"""One helper to run wrk-ork and a local-backend worker as real processes.

:func:`control_path` starts ``cosmicac run wrk-ork`` and ``cosmicac run
wrk-server-k8s-nvidia`` (backend ``local``) as separate processes talking over
the swarm on 127.0.0.1, and gives the test an RPC client of wrk-ork's
``cosmicac-ork/1`` service, as app-node would hold. The worker can be killed
(SIGKILL) and started again on the same port and storage; its agents, as
VMIs outlive a worker, keep running and are stopped at the end.

Each process costs about a second of imports: only the tests whose point is
real processes and sockets use it (admission under a flood, shell access
through the local backend's agent processes). The control path's other tests
run in-process on :mod:`tests.nodes.cluster`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from contracts.ork import (
    PROTOCOL,
    REGISTER_RACK,
    RegisterRack,
)
from p2p.connection import dial_tcp
from p2p.keys import KeyPair, load_or_create_keypair, parse_public_key
from p2p.rpc import RpcClient
from tests.cli.helpers import COSMICAC, read_ready
from tests.nodes.ork_driver import OrkDriver, hold_client
from tests.ports import free_port


@dataclass
class ControlPath(OrkDriver):
    root: Path
    nursery: trio.Nursery
    client_key: KeyPair
    ork_port: int
    worker_port: int
    client: RpcClient | None = None
    ork_key: str = ""
    ork: trio.Process | None = None
    worker_key: str = ""
    worker: trio.Process | None = None
    processes: list[trio.Process] = field(default_factory=list)
    #: Each process's stderr log, by pid.
    logs: dict[int, Path] = field(default_factory=dict)
    #: proxy-inference keys wrk-ork lets read its jobs (bench/proxy.py's real leg).
    proxy_keys: tuple[str, ...] = ()
    _client_scope: trio.CancelScope | None = None

    async def _connect(
        self, port: int, key: str, protocol: str, name: str
    ) -> tuple[RpcClient, trio.CancelScope]:
        """An RPC client of ``protocol`` on a connection to 127.0.0.1:``port``, held in
        the nursery until the returned scope is cancelled."""
        connection = await dial_tcp("127.0.0.1", port, self.client_key, parse_public_key(key))
        return await hold_client(self.nursery, connection, protocol, name)

    @property
    def ork_address(self) -> str:
        return f"127.0.0.1:{self.ork_port}"

    async def start(self) -> None:
        """Start wrk-ork and the worker side by side: wrk-ork's identity is made in its
        storage first (as wrk-ork would make it), so the worker's settings can name its
        key before wrk-ork is up; the worker dials it until it answers. About a second
        sooner than one after the other (each process is a second of imports)."""
        self.ork_key = (await trio.to_thread.run_sync(load_or_create_keypair, self.ork_storage)).hex
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.start_ork)
            nursery.start_soon(self.start_worker)

    @property
    def ork_storage(self) -> Path:
        return self.root / "ork"

    async def start_ork(self) -> trio.Process:
        """Start wrk-ork (same port and storage every time) and connect as app-node."""
        config = self.root / "ork.json"
        config.write_text(
            json.dumps(
                {
                    "storage": str(self.ork_storage),
                    "host": "127.0.0.1",
                    "port": self.ork_port,
                    "app_nodes": [self.client_key.hex],
                    "proxies": list(self.proxy_keys),
                    "tick_interval_s": 0.2,
                    "unknown_after_s": 5.0,
                    "fsync": False,
                    "log_format": "json",
                }
            )
        )
        proc = await self._spawn("run", "wrk-ork", "--config", str(config))
        ready = await read_ready(proc.stdout, "wrk-ork")
        assert not self.ork_key or ready.key == self.ork_key, (ready.key, self.ork_key)
        self.ork_key, self.ork = ready.key, proc
        self.client, self._client_scope = await self._connect(
            self.ork_port, self.ork_key, PROTOCOL, "test-app-node"
        )
        return proc

    async def kill_ork(self) -> None:
        assert self.ork is not None and self._client_scope is not None
        self._client_scope.cancel()
        self.ork.kill()
        await self.ork.wait()
        self.ork = self.client = None

    @property
    def worker_storage(self) -> Path:
        return self.root / "worker"

    async def start_worker(self, **changes) -> trio.Process:
        config = {
            "storage": str(self.worker_storage),
            "ork": self.ork_key,
            "ork_addresses": [self.ork_address],
            "host": "127.0.0.1",
            "port": self.worker_port,
            "backend": "local",
            "local": {
                "nodes": [{"name": "local-node-1", "gpus": 8}, {"name": "local-node-2", "gpus": 8}]
            },
            "agents": {"heartbeat_interval_s": 0.5, "silent_after_s": 3.0},
            "report_interval_s": 1.0,
            "fsync": False,
            "log_format": "json",
        }
        config.update(changes)
        path = self.root / "worker.json"
        path.write_text(json.dumps(config))
        proc = await self._spawn("run", "wrk-server-k8s-nvidia", "--config", str(path))
        try:
            ready = await read_ready(proc.stdout, "wrk-server-k8s-nvidia")
        except AssertionError as exc:  # say why it exited: its stderr is in its log
            log = self.logs[proc.pid]
            raise AssertionError(
                f"{exc}; exit {await proc.wait()}; its log ends: "
                f"{log.read_text(errors='replace')[-2000:]}"
            ) from None
        self.worker_key = ready.key
        self.worker = proc
        return proc

    async def kill_worker(self) -> None:
        assert self.worker is not None
        self.worker.kill()
        await self.worker.wait()
        self.worker = None

    async def _spawn(self, *args: str) -> trio.Process:
        path = self.root / f"{args[1]}-{len(self.processes)}.log"
        with path.open("wb") as log:
            proc = await trio.lowlevel.open_process(
                [*COSMICAC, *args], stdout=subprocess.PIPE, stderr=log
            )
        self.processes.append(proc)
        self.logs[proc.pid] = path
        return proc

    def failure_context(self) -> str:
        return "\n" + self.log_tails()

    def log_tails(self, lines: int = 15) -> str:
        """The end of every agent's log and of the daemons' logs (their
        connection chatter left out), for a failure to say what happened."""
        logs = sorted(self.root.glob("*.log")) + [
            folder / "agent.log" for folder in self.vmi_folders()
        ]
        parts = []
        for log in logs:
            try:
                text = log.read_text(errors="replace")
            except OSError as exc:
                parts.append(f"--- {log.name}: {exc}")
                continue
            kept = [line[:400] for line in text.splitlines() if '"p2p.host._host"' not in line]
            parts.append(f"--- {log.relative_to(self.root)}\n" + "\n".join(kept[-lines:]))
        return "\n".join(parts)

    def agent_pid(self, folder: Path) -> int:
        return json.loads((folder / "process.json").read_text())["pid"]

    def stop_agents(self) -> None:
        for folder in self.vmi_folders():
            try:
                os.killpg(self.agent_pid(folder), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass


@asynccontextmanager
async def control_path(root: Path) -> AsyncIterator[ControlPath]:
    """wrk-ork and one worker (2 local nodes of 8 GPUs), its rack registered."""
    path = None
    try:
        async with trio.open_nursery() as nursery:
            path = ControlPath(root, nursery, KeyPair.generate(), free_port(), free_port())
            await path.start()
            await path.call(REGISTER_RACK, RegisterRack(rack=path.worker_key, location="default"))
            await path.wait_rack_reported()
            yield path
            nursery.cancel_scope.cancel()
    finally:
        if path is not None:
            path.stop_agents()
        for proc in path.processes if path is not None else ():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
