"""The plans adapters produce: command lines, environments, health contracts, refusals."""

from __future__ import annotations

import sys

import pytest

from agents.inference.runtimes import (
    AdapterError,
    GpuLayoutError,
    InvalidLaunch,
    Launch,
    Lifetime,
    LocalAdapter,
    ManagedFlagError,
    ParakeetAdapter,
    StepRole,
    TopologyError,
    UnknownRuntime,
    VllmAdapter,
    adapter_for,
    gpus_per_node,
)
from contracts.model import Runtime

PY = sys.executable
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
HEAD = "10.90.0.1"


def launch(**fields) -> Launch:
    base = {"model": MODEL, "served_name": "llama", "port": 8000, "gpus": 1}
    return Launch(**(base | fields))


def argvs(plan) -> list[list[str]]:
    return [list(step.argv) for step in plan.steps]


SERVE = ["vllm", "serve", MODEL, "--host", "127.0.0.1", "--port", "8000",
         "--served-model-name", "llama"]

# (case, runtime, Launch fields, expected argv of every step)
TABLE = [
    ("vllm 1 GPU", Runtime.VLLM, {},
     [[*SERVE, "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1",
       "--disable-uvicorn-access-log"]]),
    ("vllm 8 GPUs, operator flags last", Runtime.VLLM,
     {"gpus": 8, "extra_args": ("--max-model-len", "8192")},
     [[*SERVE, "--tensor-parallel-size", "8", "--pipeline-parallel-size", "1",
       "--disable-uvicorn-access-log", "--max-model-len", "8192"]]),
    ("vllm 2x8 rank 0", Runtime.VLLM,
     {"gpus": 8, "node_count": 2, "node_rank": 0, "head_address": HEAD},
     [["ray", "start", "--head", "--port", "6379", "--node-ip-address", HEAD,
       "--num-gpus", "8", "--disable-usage-stats", "--block"],
      [PY, "-m", "agents.inference.runtimes.ray_wait", "--address", f"{HEAD}:6379",
       "--nodes", "2", "--gpus", "16", "--timeout-s", "600", "--ray", "ray"],
      [*SERVE, "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
       "--distributed-executor-backend", "ray", "--disable-uvicorn-access-log"]]),
    ("vllm 2x8 rank 1", Runtime.VLLM,
     {"gpus": 8, "node_count": 2, "node_rank": 1, "head_address": HEAD,
      "node_address": "10.90.0.2", "ray_port": 6380},
     [[PY, "-m", "agents.inference.runtimes.ray_wait", "--address", f"{HEAD}:6380",
       "--reachable", "--timeout-s", "600"],
      ["ray", "start", "--address", f"{HEAD}:6380", "--node-ip-address", "10.90.0.2",
       "--num-gpus", "8", "--disable-usage-stats", "--block"]]),
    ("parakeet on a GPU", Runtime.PARAKEET,
     {"model": "nvidia/parakeet-tdt-0.6b-v2", "served_name": "parakeet"},
     [[PY, "-m", "agents.inference.runtimes.parakeet_server", "--model",
       "nvidia/parakeet-tdt-0.6b-v2", "--host", "127.0.0.1", "--port", "8000",
       "--served-name", "parakeet", "--device", "cuda"]]),
    ("parakeet without GPUs", Runtime.PARAKEET,
     {"model": "nvidia/parakeet-tdt-0.6b-v2", "served_name": "p", "gpus": 0},
     [[PY, "-m", "agents.inference.runtimes.parakeet_server", "--model",
       "nvidia/parakeet-tdt-0.6b-v2", "--host", "127.0.0.1", "--port", "8000",
       "--served-name", "p", "--device", "cpu"]]),
    ("local", Runtime.LOCAL, {"model": "demo", "served_name": "tiny", "gpus": 0},
     [[PY, "-m", "agents.inference.server", "--model", "demo", "--host", "127.0.0.1",
       "--port", "8000", "--served-name", "tiny"]]),
]


@pytest.mark.parametrize(("runtime", "fields", "expected"),
                         [case[1:] for case in TABLE], ids=[case[0] for case in TABLE])
def test_each_runtime_plans_these_command_lines(runtime, fields, expected) -> None:
    plan = adapter_for(runtime).plan(launch(**fields))
    assert plan.runtime is runtime
    assert argvs(plan) == expected


def test_a_single_node_plan_listens_and_checks_one_token() -> None:
    plan = adapter_for(Runtime.VLLM).plan(launch(gpus=8, host="0.0.0.0", port=9000))
    assert plan.listens and plan.base_url == "http://127.0.0.1:9000"
    assert plan.health_path == "/health"
    assert plan.server is plan.steps[0] and plan.kept == plan.steps
    check = plan.deep_check
    assert check is not None and (check.method, check.path) == ("POST", "/v1/completions")
    assert dict(check.body) == {"model": "llama", "prompt": "Hello", "max_tokens": 1,
                                "temperature": 0}
    assert plan.startup_timeout_s == 1800.0
    assert dict(plan.steps[0].env) == {}


def test_multi_node_rank_0_sequences_ray_head_wait_then_server() -> None:
    plan = VllmAdapter().plan(launch(gpus=8, node_count=2, head_address=HEAD,
                                     overlay_interface="ovl0", ib_hca="mlx5",
                                     env={"HF_HOME": "/models", "NCCL_DEBUG": "INFO"}))
    head, wait, serve = plan.steps
    assert [s.role for s in plan.steps] == [StepRole.RAY_HEAD, StepRole.WAIT, StepRole.SERVER]
    assert [s.lifetime for s in plan.steps] == [Lifetime.KEEP_RUNNING, Lifetime.RUN_TO_EXIT,
                                                 Lifetime.KEEP_RUNNING]
    assert wait.timeout_s == 630.0
    network = {"VLLM_HOST_IP": HEAD, "NCCL_SOCKET_IFNAME": "ovl0", "GLOO_SOCKET_IFNAME": "ovl0",
               "TP_SOCKET_IFNAME": "ovl0", "NCCL_IB_HCA": "mlx5",
               "RAY_USAGE_STATS_ENABLED": "0", "HF_HOME": "/models", "NCCL_DEBUG": "INFO"}
    assert dict(head.env) == network
    assert dict(serve.env) == network | {"RAY_ADDRESS": f"{HEAD}:6379"}
    assert plan.listens and plan.server is serve and plan.kept == (head, serve)


def test_multi_node_rank_1_does_not_listen_and_lives_by_its_ray_worker() -> None:
    plan = VllmAdapter().plan(launch(gpus=4, node_count=3, node_rank=2, head_address=HEAD,
                                     node_address="10.90.0.3", node_wait_timeout_s=60))
    wait, worker = plan.steps
    assert not plan.listens and plan.server is None
    assert plan.base_url is plan.health_path is plan.deep_check is None
    assert plan.kept == (worker,) and worker.role is StepRole.RAY_WORKER
    assert worker.env["VLLM_HOST_IP"] == "10.90.0.3"
    assert wait.argv[-1] == "60" and wait.timeout_s == 90.0
    assert plan.startup_timeout_s == 90.0


def test_operator_env_wins_over_the_adapters() -> None:
    plan = VllmAdapter().plan(launch(node_count=2, head_address=HEAD,
                                     env={"RAY_USAGE_STATS_ENABLED": "1"}))
    assert plan.steps[0].env["RAY_USAGE_STATS_ENABLED"] == "1"


def test_ipv6_head_addresses_are_bracketed() -> None:
    plan = VllmAdapter().plan(launch(node_count=2, node_rank=1, head_address="fd00::1"))
    assert "[fd00::1]:6379" in plan.steps[1].argv


def test_commands_can_be_moved() -> None:
    plan = VllmAdapter(vllm="/opt/vllm/bin/vllm", ray="/opt/vllm/bin/ray").plan(
        launch(node_count=2, head_address=HEAD))
    assert plan.steps[0].argv[0] == "/opt/vllm/bin/ray"
    assert plan.steps[1].argv[-1] == "/opt/vllm/bin/ray"
    assert plan.steps[2].argv[0] == "/opt/vllm/bin/vllm"


def test_local_speech_models_get_no_completion_check() -> None:
    assert LocalAdapter().plan(launch(model="pocketsphinx-en", gpus=0)).deep_check is None
    assert LocalAdapter().plan(launch(model="demo", gpus=0)).deep_check is not None
    assert ParakeetAdapter().plan(launch(model="nvidia/parakeet-tdt-0.6b-v2")).deep_check is None


def test_startup_timeout_can_be_overridden() -> None:
    assert LocalAdapter().plan(launch(startup_timeout_s=5)).startup_timeout_s == 5
    assert LocalAdapter().plan(launch()).startup_timeout_s == 120.0
    assert ParakeetAdapter().plan(launch()).startup_timeout_s == 900.0


REFUSALS = [
    ("vllm without GPUs", Runtime.VLLM, {"gpus": 0}, GpuLayoutError, "gpus"),
    ("multi-node without head", Runtime.VLLM, {"node_count": 2}, TopologyError,
     "head_address"),
    ("rank 0 elsewhere than the head", Runtime.VLLM,
     {"node_count": 2, "head_address": HEAD, "node_address": "10.90.0.9"},
     TopologyError, "node_address"),
    ("parakeet over nodes", Runtime.PARAKEET, {"node_count": 2, "head_address": HEAD},
     TopologyError, "node_count"),
    ("local over nodes", Runtime.LOCAL, {"node_count": 2, "head_address": HEAD},
     TopologyError, "node_count"),
    ("vllm --port in extra_args", Runtime.VLLM, {"extra_args": ("--port", "9")},
     ManagedFlagError, "extra_args"),
    ("vllm --port=9", Runtime.VLLM, {"extra_args": ("--port=9",)}, ManagedFlagError,
     "extra_args"),
    ("vllm abbreviated -tp", Runtime.VLLM, {"extra_args": ("-tp", "2")}, ManagedFlagError,
     "extra_args"),
    ("vllm abbreviation of a managed flag", Runtime.VLLM,
     {"extra_args": ("--tensor-parallel", "2")}, ManagedFlagError, "extra_args"),
    ("parakeet --device", Runtime.PARAKEET, {"extra_args": ("--device", "cpu")},
     ManagedFlagError, "extra_args"),
    ("local --served-name", Runtime.LOCAL, {"extra_args": ("--served-name", "x")},
     ManagedFlagError, "extra_args"),
]


@pytest.mark.parametrize(("runtime", "fields", "error", "field"),
                         [case[1:] for case in REFUSALS], ids=[case[0] for case in REFUSALS])
def test_adapters_refuse_with_the_field_named(runtime, fields, error, field) -> None:
    with pytest.raises(error) as caught:
        adapter_for(runtime).plan(launch(**fields))
    assert caught.value.field == field
    assert caught.value.runtime == runtime.value
    assert str(caught.value).startswith(f"{runtime.value}: {field}: ")
    assert not isinstance(caught.value, RuntimeError)


def test_unrelated_operator_flags_pass() -> None:
    plan = VllmAdapter().plan(launch(extra_args=("--max-model-len", "4096", "--dtype=bfloat16",
                                                 "8192")))
    assert plan.steps[0].argv[-4:] == ("--max-model-len", "4096", "--dtype=bfloat16", "8192")


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"model": " "}, "model"), ({"served_name": ""}, "served_name"), ({"port": 0}, "port"),
     ({"port": 70000}, "port"), ({"ray_port": 0}, "ray_port"), ({"gpus": -1}, "gpus"),
     ({"node_count": 0}, "node_count"), ({"node_count": 2, "node_rank": 2}, "node_rank"),
     ({"startup_timeout_s": 0}, "startup_timeout_s"),
     ({"node_wait_timeout_s": -1}, "node_wait_timeout_s"),
     ({"extra_args": "--x"}, "extra_args"), ({"env": {"A=B": "1"}}, "env"),
     ({"env": {"A": 1}}, "env")],
)
def test_a_launch_is_validated_when_built(fields, field) -> None:
    with pytest.raises(InvalidLaunch) as caught:
        launch(**fields)
    assert caught.value.field == field


def test_a_launch_is_frozen_and_its_env_read_only() -> None:
    env = {"A": "1"}
    built = launch(env=env, extra_args=["--x"])
    env["A"] = "2"
    assert built.env["A"] == "1" and built.extra_args == ("--x",)
    with pytest.raises(TypeError):
        built.env["B"] = "3"  # type: ignore[index]


def test_adapter_for_takes_values_and_refuses_others() -> None:
    assert isinstance(adapter_for("parakeet"), ParakeetAdapter)
    assert isinstance(adapter_for(Runtime.LOCAL), LocalAdapter)
    with pytest.raises(UnknownRuntime) as caught:
        adapter_for("tgi")
    assert caught.value.field == "runtime" and "vllm, parakeet, local" in str(caught.value)
    assert isinstance(caught.value, AdapterError)


def test_gpus_per_node_splits_evenly_or_names_gpus() -> None:
    assert gpus_per_node(16, 2) == 8
    assert gpus_per_node(3, 1) == 3
    with pytest.raises(GpuLayoutError) as caught:
        gpus_per_node(12, 5)
    assert caught.value.field == "gpus" and "12 GPUs" in str(caught.value)
    with pytest.raises(TopologyError):
        gpus_per_node(8, 0)


@pytest.mark.parametrize(
    ("status", "payload", "passed"),
    [(200, {"choices": [{"text": "!"}], "usage": {"completion_tokens": 1}}, True),
     (200, {"choices": [], "usage": {}}, False),
     (200, {"choices": [{"text": "!"}]}, False),
     (503, {"choices": [{"text": "!"}], "usage": {}}, False),
     (200, "not json", False)],
)
def test_deep_check_passes_only_a_200_with_a_choice_and_usage(status, payload, passed) -> None:
    check = VllmAdapter().plan(launch()).deep_check
    assert check is not None and check.passed(status, payload) is passed
