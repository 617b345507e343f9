"""The agent as a real process against an in-process worker over 127.0.0.1 sockets."""

from __future__ import annotations

import json
import re

import pytest
import trio

from agents.instance import open_shell
from contracts.monitor import SYSTEM
from nodes.k8s_worker.agents import AgentEventKind
from p2p.connection import dial_tcp
from p2p.errors import P2PError
from p2p.keys import KeyPair, load_keypair

from ..p2p.helpers import wait_until
from .helpers import Collected, agent_config, running_worker, start_agent, stop, vmi_of


async def test_an_agent_says_hello_ready_heartbeats_ships_logs_serves_shells_and_exits_0(
        nursery, tmp_path):
    """An agent process run twice on the same storage (the same identity): each says
    hello, then ready, heartbeats, ships its logs to the worker (telemetry on), and
    exits 0 on SIGTERM. The first, a container agent, also serves shells to its users
    and nobody else (one process for all of it: each costs its start)."""
    user, stranger = KeyPair.generate(), KeyPair.generate()
    collected = Collected()
    async with running_worker(nursery, on_logs=collected) as worker:
        storage = tmp_path / "storage"
        config = agent_config(worker.keypair.public_key, address=worker.address,
                              storage=str(storage))
        config = config.model_copy(update={"authorized_keys": (user.hex,),
                                           "telemetry": True})
        vmi = vmi_of(config)
        worker.registry.expect(vmi)
        (tmp_path / "agent.json").write_text(config.to_json())
        keys = []
        for run in range(2):  # the second run: same storage, same identity
            log = tmp_path / f"agent-{run}.log"
            proc = await start_agent(tmp_path / "agent.json", log)
            try:
                hello = await worker.next_event()
                if run == 1 and hello.kind is AgentEventKind.SILENT:
                    hello = await worker.next_event()  # the first run's agent stopped
                assert (hello.vmi_name, hello.kind) == (vmi.name, AgentEventKind.HELLO)
                ready = await worker.next_event()
                assert (ready.vmi_name, ready.kind) == (vmi.name, AgentEventKind.READY)
                first = worker.registry.state(vmi.name).last_report_at
                if run == 0:
                    await _shells_for_users_only(nursery, log, user, stranger)
                # Its own logging reaches the worker as System records.
                readies = run + 1
                await wait_until(lambda n=readies: sum(
                    "agent.ready" in t for t in collected.texts()) >= n, limit_s=20)
                with trio.fail_after(10):  # heartbeats keep coming
                    while worker.registry.state(vmi.name).last_report_at < first + 0.3:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                keys.append(worker.registry.state(vmi.name).key)
            finally:
                code = await stop(proc)
            assert code == 0, log.read_text()
        assert keys[0] == keys[1] == load_keypair(storage).public_key
        lines = (tmp_path / "agent-0.log").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        assert any("agent.hello" in r.get("message", "") for r in records), lines
    texts = collected.texts()
    assert any("agent.started" in t for t in texts), texts  # logged before the hello
    assert {(r.job_id, r.replica, r.service, r.source) for r in collected.records} == {
        (config.job_id, 0, "agent-instance", SYSTEM)}


async def _shells_for_users_only(nursery, log, user: KeyPair, stranger: KeyPair) -> None:
    """The running agent (its log in ``log``) gives ``user`` a shell and refuses ``stranger``."""
    started = re.search(r"agent\.started .* key=([0-9a-f]{64}) address=([\d.]+):(\d+)",
                        log.read_text())
    assert started, log.read_text()
    agent_key = bytes.fromhex(started[1])
    host, port = started[2], int(started[3])
    with trio.fail_after(20):
        connection = await dial_tcp(host, port, user, agent_key)
        await nursery.start(connection.run)
        session = await open_shell(connection, argv=["sh", "-c", "echo hi; exit 3"])
        output = b"".join([event.data async for event in session])
        assert output == b"hi\n"
        assert (await session.wait_exit()).code == 3
        await connection.aclose()
        with pytest.raises((P2PError, OSError, trio.BrokenResourceError)):
            refused = await dial_tcp(host, port, stranger, agent_key)
            await nursery.start(refused.run)
            await open_shell(refused, argv=["true"])


async def test_a_wrong_token_is_refused_and_the_agent_exits_1(nursery, tmp_path):
    async with running_worker(nursery) as worker:
        config = agent_config(worker.keypair.public_key, address=worker.address,
                              storage=str(tmp_path / "storage"))
        worker.registry.expect(vmi_of(config.model_copy(update={"report_token": "0" * 64})))
        (tmp_path / "agent.json").write_text(config.to_json())
        proc = await start_agent(tmp_path / "agent.json", tmp_path / "agent.log")
        try:
            with trio.fail_after(15):
                code = await proc.wait()
        finally:
            await stop(proc)
        output = (tmp_path / "agent.log").read_text()
        assert code == 1, output
        assert "FORBIDDEN" in output
        state = worker.registry.state(vmi_of(config).name)
        assert state.key is None and state.last_report_at is None


async def test_an_agent_says_hello_again_when_the_worker_comes_back(nursery, tmp_path):
    keypair = KeyPair.generate()
    async with running_worker(nursery, keypair=keypair) as worker:
        port = worker.address[1]
        config = agent_config(keypair.public_key, address=worker.address,
                              storage=str(tmp_path / "storage"))
        worker.registry.expect(vmi_of(config))
        (tmp_path / "agent.json").write_text(config.to_json())
        proc = await start_agent(tmp_path / "agent.json", tmp_path / "agent.log")
        assert (await worker.next_event()).kind is AgentEventKind.HELLO
        assert (await worker.next_event()).kind is AgentEventKind.READY
    try:
        # A new worker process: same key, same port, its registry re-learns the VMI.
        async with running_worker(nursery, keypair=keypair, port=port) as worker:
            worker.registry.expect(vmi_of(config))
            assert (await worker.next_event()).kind is AgentEventKind.HELLO
            assert (await worker.next_event()).kind is AgentEventKind.READY
    finally:
        code = await stop(proc)
    assert code == 0, (tmp_path / "agent.log").read_text()
