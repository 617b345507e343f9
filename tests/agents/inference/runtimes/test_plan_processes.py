"""Plans run as real processes against subprocess doubles of ``vllm`` and ``ray``.

The doubles (tests/agents/inference/doubles) parse the exact argv a plan
generates, without abbreviations, so a misspelt flag fails here, and they
behave as the real commands do from outside: the ray head listens and counts
joined nodes, ``vllm serve`` refuses a cluster short of GPUs and serves vLLM's
API. The runner below follows the plan as the supervisor must (RUN_TO_EXIT
steps waited for, KEEP_RUNNING steps kept, stopped in reverse order).

Real time, bounded: each wait has its own deadline and every test an overall one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from agents.inference.runtimes import Launch, Lifetime, RuntimePlan, adapter_for
from contracts.model import Runtime
from nodes.kit.tls import client_tls
from tests.agents.inference.doubles import bin_dir
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[4]
#: Bound on any one step or wait here; the doubles start in about a second.
STEP_BOUND_S = 30.0
#: One TLS context for the module's clients (plain HTTP to 127.0.0.1 all the same):
#: httpx otherwise builds one per client, parsing certifi's bundle (20-100 ms of CPU).
TLS = client_tls()

pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    path = f"{bin_dir(tmp_path)}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT),
            "RAY_DOUBLE_RECORD": str(tmp_path / "ray.jsonl"),
            "VLLM_DOUBLE_RECORD": str(tmp_path / "vllm.jsonl")}


def records(tmp_path: Path, name: str) -> list[dict]:
    path = tmp_path / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


class Failed(Exception):
    pass


def dump_logs(folder: Path) -> str:
    """Every step's output, for a failure message (small files, read once)."""
    paths = sorted(folder.glob("*.log"))
    return "\n".join(f"--- {path.name}\n{path.read_text()}" for path in paths)


@asynccontextmanager
async def running(plan: RuntimePlan, env: Mapping[str, str], logs: Path,
                  tag: str = "") -> AsyncIterator[list[trio.Process]]:
    """Start ``plan``'s steps as the supervisor would; stop the kept ones in reverse order."""
    kept: list[trio.Process] = []
    async with trio.open_nursery() as nursery:
        try:
            for step in plan.steps:
                log = (logs / f"{tag}{step.name}.log").open("wb")
                command = partial(trio.run_process, list(step.argv), env={**env, **step.env},
                                  stdout=log, stderr=subprocess.STDOUT, check=False, cwd=ROOT)
                if step.lifetime is Lifetime.RUN_TO_EXIT:
                    assert step.timeout_s is not None
                    with trio.fail_after(min(step.timeout_s, STEP_BOUND_S)):
                        done = await command()
                    if done.returncode != 0:
                        text = (logs / f"{tag}{step.name}.log").read_text()
                        raise Failed(f"{step.name} exited {done.returncode}: {text}")
                else:
                    kept.append(await nursery.start(command))
            yield kept
        finally:
            for process in reversed(kept):
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    with trio.move_on_after(10):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
            nursery.cancel_scope.cancel()


async def wait_healthy(client: httpx.AsyncClient, plan: RuntimePlan,
                       processes: list[trio.Process], logs: Path) -> None:
    assert plan.base_url and plan.health_path
    with trio.fail_after(STEP_BOUND_S):
        while True:
            for process in processes:
                if process.returncode is not None:
                    raise Failed(f"a kept step exited {process.returncode}: {dump_logs(logs)}")
            try:
                response = await client.get(plan.base_url + plan.health_path)
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.1)


async def check_serving(plan: RuntimePlan, processes: list[trio.Process], logs: Path,
                        served_name: str) -> None:
    """/health, the plan's deep check, and a streamed chat whose last chunk carries usage."""
    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        await wait_healthy(client, plan, processes, logs)
        check = plan.deep_check
        assert check is not None
        response = await client.request(check.method, plan.base_url + check.path,
                                        json=dict(check.body or {}))
        assert check.passed(response.status_code, response.json()), response.text
        assert response.json()["usage"]["completion_tokens"] == 1

        body = {"model": served_name, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8}
        events = []
        async with client.stream("POST", f"{plan.base_url}/v1/chat/completions",
                                 json=body) as stream:
            assert stream.status_code == 200
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["choices"] == [] and last["usage"]["completion_tokens"] >= 1
        assert last["model"] == served_name


@pytest.mark.parametrize("gpus", [1, 8])
async def test_single_node_vllm_plan_serves_through_the_vllm_double(
    gpus: int, env: dict[str, str], tmp_path: Path
) -> None:
    launch = Launch(model="meta-llama/Llama-3.1-8B-Instruct", served_name="llama",
                    port=free_port(), gpus=gpus)
    plan = adapter_for(Runtime.VLLM).plan(launch)
    with trio.fail_after(60):
        async with running(plan, env | {"VLLM_DOUBLE_GPUS": str(gpus)}, tmp_path) as kept:
            await check_serving(plan, kept, tmp_path, "llama")
    (run,) = records(tmp_path, "vllm")
    assert run["argv"] == list(plan.steps[0].argv[1:])
    assert records(tmp_path, "ray") == []


async def test_two_node_vllm_plans_join_ray_then_serve_from_rank_0(
    env: dict[str, str], tmp_path: Path
) -> None:
    common = {"model": "meta-llama/Llama-3.1-70B-Instruct", "served_name": "llama70",
              "port": free_port(), "gpus": 8, "node_count": 2, "head_address": "127.0.0.1",
              "ray_port": free_port(), "node_wait_timeout_s": 20.0,
              "overlay_interface": "lo"}
    head_plan = adapter_for(Runtime.VLLM).plan(Launch(**common, node_rank=0))
    worker_plan = adapter_for(Runtime.VLLM).plan(
        Launch(**common, node_rank=1, node_address="127.0.0.1"))
    assert not worker_plan.listens
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            # Rank 1 first: its wait step must hold it until rank 0's head is up.
            worker_up = trio.Event()
            kept_worker: list[trio.Process] = []

            async def rank_1() -> None:
                async with running(worker_plan, env, tmp_path, "r1-") as kept:
                    kept_worker.extend(kept)
                    worker_up.set()
                    await trio.sleep_forever()

            nursery.start_soon(rank_1)
            await trio.sleep(0.5)
            async with running(head_plan, env, tmp_path, "r0-") as kept:
                await check_serving(head_plan, kept, tmp_path, "llama70")
                await worker_up.wait()
                # Rank 1's health, by the plan's rule: its kept steps live.
                assert all(p.returncode is None for p in kept_worker)
            nursery.cancel_scope.cancel()

    ray_runs = [run["argv"] for run in records(tmp_path, "ray")]
    assert list(head_plan.steps[0].argv[1:]) in ray_runs
    assert list(worker_plan.steps[1].argv[1:]) in ray_runs
    assert ["status", "--address", f"127.0.0.1:{common['ray_port']}"] in ray_runs
    (vllm_run,) = records(tmp_path, "vllm")
    assert head_plan.server is not None
    assert vllm_run["argv"] == list(head_plan.server.argv[1:])
    assert vllm_run["env"]["RAY_ADDRESS"] == f"127.0.0.1:{common['ray_port']}"
    assert vllm_run["env"]["VLLM_HOST_IP"] == "127.0.0.1"
    assert vllm_run["env"]["NCCL_SOCKET_IFNAME"] == "lo"


async def test_rank_0_alone_fails_its_bounded_wait_with_what_it_saw(
    env: dict[str, str], tmp_path: Path
) -> None:
    plan = adapter_for(Runtime.VLLM).plan(Launch(
        model="m", served_name="m", port=free_port(), gpus=8, node_count=2,
        head_address="127.0.0.1", ray_port=free_port(), node_wait_timeout_s=3.0))
    with trio.fail_after(60), pytest.raises(ExceptionGroup) as caught:
        async with running(plan, env, tmp_path):
            pass
    assert caught.group_contains(
        Failed, match=r"^wait-ray-nodes exited 1: error: Ray cluster not complete after 3s: "
                      r"wanted 2 nodes and 16 GPUs, last saw nodes=1 gpus=8\.0")
    # The supervisor would stop the Ray head the plan started: so did the runner.
    assert (tmp_path / "ray-head.log").read_text().startswith("Ray runtime started")


async def test_the_vllm_double_refuses_a_misspelt_flag(env: dict[str, str],
                                                       tmp_path: Path) -> None:
    plan = adapter_for(Runtime.VLLM).plan(Launch(
        model="m", served_name="m", port=free_port(), gpus=1,
        extra_args=("--max-model-length", "4096")))
    (step,) = plan.steps
    with trio.fail_after(STEP_BOUND_S):
        done = await trio.run_process(list(step.argv), env=env, capture_stderr=True,
                                      check=False, cwd=ROOT)
    assert done.returncode == 2
    assert b"unrecognized arguments: --max-model-length" in done.stderr


async def test_local_plan_serves_the_demo_engine(env: dict[str, str], tmp_path: Path) -> None:
    plan = adapter_for(Runtime.LOCAL).plan(Launch(model="demo", served_name="tiny",
                                                  port=free_port(), gpus=0))
    with trio.fail_after(60):
        async with running(plan, env, tmp_path) as kept:
            await check_serving(plan, kept, tmp_path, "tiny")


async def test_parakeet_plan_without_nemo_exits_2_naming_the_package(
    env: dict[str, str], tmp_path: Path
) -> None:
    plan = adapter_for(Runtime.PARAKEET).plan(Launch(
        model="nvidia/parakeet-tdt-0.6b-v2", served_name="parakeet", port=free_port(), gpus=1))
    (step,) = plan.steps
    with trio.fail_after(STEP_BOUND_S):
        done = await trio.run_process(list(step.argv), env={**env, **step.env},
                                      capture_stderr=True, check=False, cwd=ROOT)
    assert done.returncode == 2
    assert b"pip install 'nemo_toolkit[asr]'" in done.stderr
