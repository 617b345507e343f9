"""The whole inference path with real parts: wrk-ork, a worker and the job's agents (the
real InferenceService in front of the ``demo`` model server, a real process) in the
test's trio run on an in-memory network (tests/nodes/cluster.py), a shared database
with app-node's replica writing the API key, and the proxy following wrk-ork, its HTTP
side on a real socket. The official ``openai`` package is the client. The proxy as a
``cosmicac run`` process: tests/nodes/proxy_inference/test_daemon.py."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import pytest
import trio

from agents.inference import InferenceWorkload, SupervisorPolicy
from contracts.model import JobSpec
from contracts.ork import WATCH_JOBS, WatchJobs
from crdt import FsyncPolicy, PutApiKey, run_database_service
from nodes.proxy_inference import ProxySettings, serve_proxy
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.swarm import Swarm, SwarmConfig
from tests.nodes.cluster import IMAGE, cluster, status
from tests.p2p.helpers import wait_until

pytestmark = pytest.mark.slow

SECRET = "sk-end-to-end-" + "x" * 20
MESSAGES = [{"role": "user", "content": "Say something about trio."}]


def model_servers(port: int) -> list[int]:
    """PIDs of the ``agents.inference.server`` processes listening on ``port``."""
    servers = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"agents.inference.server" in cmdline
            and b"--port" in cmdline
            and cmdline[cmdline.index(b"--port") + 1] == str(port).encode()
        ):
            servers.append(int(entry))
    return servers


class Totals:
    """What the responses reported, summed as the client saw it."""

    def __init__(self) -> None:
        self.requests = self.prompt = self.completion = self.total = 0

    def add(self, usage) -> None:
        self.requests += 1
        self.prompt += usage.prompt_tokens
        self.completion += getattr(usage, "completion_tokens", 0) or 0
        self.total += usage.total_tokens


async def test_openai_client_through_the_proxy_to_real_agents(tmp_path):
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)

    proxy_key = load_or_create_keypair(tmp_path / "proxy")
    (tmp_path / "cp").mkdir()
    with trio.fail_after(240):
        # The killed model server is started again at once, not after a second.
        quick = SupervisorPolicy(backoff_min_s=0.05)
        async with (
            cluster(
                tmp_path / "cp",
                proxy_keys=(proxy_key.hex,),
                workload=lambda config: InferenceWorkload(config, policy=quick),
            ) as path,
            trio.open_nursery() as nursery,
        ):
            ork_address = path.ork_address
            # app-node's replica of the shared database, with the key.
            address, network = path.machine()
            app_node = Swarm(
                KeyPair.generate(),
                config=SwarmConfig(host=address, bootstrap=(ork_address,), lookup_max_s=2.0),
                network=network,
            )
            await nursery.start(app_node.run)
            admin = await nursery.start(
                functools.partial(
                    run_database_service,
                    tmp_path / "app-node",
                    swarm=app_node,
                    allow=frozenset({proxy_key.public_key}),
                    fsync=FsyncPolicy.NEVER,
                )
            )
            await admin.db.append(
                [PutApiKey.with_secret("key-e2e", "t1", "e2e", SECRET, [], int(time.time() * 1000))]
            )
            address, network = path.machine()
            settings = ProxySettings(
                storage=tmp_path / "proxy",
                database=admin.db.bootstrap,
                host=address,
                port=0,
                bootstrap=[ork_address],
                ork=bytes.fromhex(path.ork_key),
                ork_addresses=[ork_address],
                http={"host": "127.0.0.1", "port": 0},
                fsync=False,
                usage={"flush_interval_s": 0.05},
                replica_backoff_s=0.5,
            )
            proxy = await nursery.start(functools.partial(serve_proxy, settings, network=network))

            job = await path.create(
                JobSpec(
                    name="chat",
                    team="t1",
                    type="inference",
                    image=IMAGE,
                    gpus=1,
                    replicas=2,
                    runtime="local",
                    model="demo",
                    served_name="chat",
                )
            )
            job = await path.wait_job(job.id, status("active"), limit_s=120)
            agents = [bytes.fromhex(r.agents[0]) for r in job.replicas]
            await wait_until(lambda: all(key in proxy.pool.clients for key in agents), limit_s=60)
            await wait_until(
                lambda: proxy.front.keys.db.lengths.get(admin.db.key, 0) >= 1, limit_s=30
            )

            client = openai.OpenAI(base_url=proxy.url, api_key=SECRET, max_retries=0, timeout=30)
            totals = Totals()

            def chat():
                return client.chat.completions.create(
                    model="chat", messages=MESSAGES, max_tokens=16
                )

            def streamed(include_usage: bool):
                options = {"include_usage": True} if include_usage else None
                stream = client.chat.completions.create(
                    model="chat",
                    messages=MESSAGES,
                    max_tokens=16,
                    stream=True,
                    stream_options=options,
                )
                return list(stream)

            run = trio.to_thread.run_sync
            answer = await run(chat)
            totals.add(answer.usage)
            text = answer.choices[0].message.content
            assert text and answer.usage.completion_tokens > 0
            assert [m.id for m in (await run(client.models.list)).data] == ["chat"]

            chunks = await run(streamed, True)
            usage_chunks = [c for c in chunks if c.usage is not None]
            assert len(usage_chunks) == 1 and usage_chunks[0].choices == []
            totals.add(usage_chunks[0].usage)
            assert usage_chunks[0].usage == answer.usage  # the demo engine is deterministic
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
            chunks = await run(streamed, False)
            assert all(c.usage is None for c in chunks)  # the agent strips what we asked for
            totals.requests += 1
            totals.prompt += answer.usage.prompt_tokens
            totals.completion += answer.usage.completion_tokens
            totals.total += answer.usage.total_tokens

            completion = await run(
                lambda: client.completions.create(
                    model="chat", prompt="Once upon a time", max_tokens=8
                )
            )
            assert completion.choices[0].text
            totals.add(completion.usage)
            embedding = await run(lambda: client.embeddings.create(model="chat", input="hello"))
            assert len(embedding.data[0].embedding) == 64
            totals.add(embedding.usage)

            with pytest.raises(openai.NotFoundError) as missing:
                await run(lambda: client.chat.completions.create(model="nope", messages=MESSAGES))
            assert missing.value.code == "model_not_found"
            stranger = openai.OpenAI(base_url=proxy.url, api_key="sk-unknown", max_retries=0)
            with pytest.raises(openai.AuthenticationError) as refused:
                await run(lambda: stranger.chat.completions.create(model="chat", messages=MESSAGES))
            assert refused.value.code == "invalid_api_key"

            # Two replicas: requests alternate.
            before = dict(proxy.pool.answered)
            for _ in range(6):
                totals.add((await run(chat)).usage)
            assert [proxy.pool.answered[k] - before.get(k, 0) for k in agents] == [3, 3]

            # One replica's model server is killed: requests keep succeeding on the
            # other, and the replica's failure reaches wrk-ork (the agent tells the
            # worker it is not ready: the job leaves Active until it is back).
            folders = path.vmi_folders()
            assert len(folders) == 2
            victims = model_servers(path.backend.vm_of(folders[0]).agent.workload.port)
            assert len(victims) == 1
            statuses: list[str] = []

            async def watch(task_status=trio.TASK_STATUS_IGNORED) -> None:
                assert path.client is not None
                async with path.client.stream(WATCH_JOBS, WatchJobs(job_id=job.id)) as events:
                    task_status.started()
                    async for event in events:
                        statuses.append(event.status.value)

            await nursery.start(watch)
            os.kill(victims[0], signal.SIGKILL)
            for _ in range(10):
                totals.add((await run(chat)).usage)
            await wait_until(lambda: statuses[-2:] == ["starting", "active"], limit_s=60)

            # Usage rows equal what the responses reported, replicated to app-node.
            def usage_matches() -> bool:
                return admin_rows == (
                    totals.requests,
                    totals.prompt,
                    totals.completion,
                    totals.total,
                )

            admin_rows: tuple = ()
            with trio.move_on_after(30):
                while not usage_matches():
                    rows = await admin.db.usage("key-e2e", model="chat")
                    admin_rows = (
                        sum(r.requests for r in rows),
                        sum(r.prompt for r in rows),
                        sum(r.completion for r in rows),
                        sum(r.total for r in rows),
                    )
                    if not usage_matches():
                        await trio.sleep(0.1)
            proxy_rows = await proxy.recorder.db.usage("key-e2e", model="chat")
            assert admin_rows == (
                totals.requests,
                totals.prompt,
                totals.completion,
                totals.total,
            ), (proxy_rows, len(proxy.recorder.book))
            assert await admin.db.last_used("key-e2e") is not None
            nursery.cancel_scope.cancel()
