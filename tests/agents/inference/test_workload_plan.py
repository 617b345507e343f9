"""What the inference workload hands the runtime adapter: the head's name, this
VMI's overlay address and NCCL's interface and HCAs, from the agent's config.

Pure: the overlay interface's address comes from a fake, nothing starts.
"""

from __future__ import annotations

import json

import pytest

from agents.inference import InferenceWorkload
from agents.inference._workload import interface_ipv4
from contracts.agent_config import AgentConfig, AgentConfigError, load_agent_config
from contracts.model import JobType, Runtime

#: The head's name as the kubevirt backend renders it.
HEAD = "cac-4455667788990011-r0-n0.cac-4455667788990011-r0.cosmicac.svc.cluster.local"
#: Each rank's IPv4 on the overlay (what the overlay NAD's IPAM would give).
OVERLAY_IPS = {0: "10.90.0.1", 1: "10.90.0.2"}


def vllm_config(rank: int, **fields) -> AgentConfig:
    base = {"job_id": "j-4455667788990011", "replica": 0, "node_rank": rank, "node_count": 2,
            "job_type": JobType.INFERENCE, "runtime": Runtime.VLLM,
            "model": "meta-llama/Llama-3.1-70B", "gpus": 8, "worker": "cd" * 32,
            "report_token": "ef" * 32, "head_address": HEAD, "overlay_interface": "eth1",
            "ib_hca": "mlx5"}
    return AgentConfig(**{**base, **fields})


def workload(config: AgentConfig, address: str | None = "overlay ip of the rank",
             asked: list[str] | None = None) -> InferenceWorkload:
    def interface_address(name: str) -> str | None:
        if asked is not None:
            asked.append(name)
        return OVERLAY_IPS[config.node_rank] if address == "overlay ip of the rank" else address

    return InferenceWorkload(config, port=8000, interface_address=interface_address)


def steps(plan):
    return {step.name: step for step in plan.steps}


def test_a_worker_rank_dials_the_head_by_name_and_gives_ray_its_overlay_address():
    asked: list[str] = []
    plan = workload(vllm_config(1), asked=asked).plan()
    wait, ray = steps(plan)["wait-ray-head"], steps(plan)["ray-worker"]
    assert asked == ["eth1"]
    assert wait.argv[wait.argv.index("--address") + 1] == f"{HEAD}:6379"
    assert ray.argv[ray.argv.index("--address") + 1] == f"{HEAD}:6379"
    assert ray.argv[ray.argv.index("--node-ip-address") + 1] == "10.90.0.2"
    assert {key: ray.env[key] for key in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME",
                                          "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                                          "NCCL_IB_HCA")} == {
        "VLLM_HOST_IP": "10.90.0.2", "NCCL_SOCKET_IFNAME": "eth1",
        "GLOO_SOCKET_IFNAME": "eth1", "TP_SOCKET_IFNAME": "eth1", "NCCL_IB_HCA": "mlx5"}


def test_the_head_runs_ray_and_vllm_on_its_own_overlay_address_not_its_dns_name():
    plan = workload(vllm_config(0, ib_hca="=mlx5_0:1,mlx5_1:1")).plan()
    head, wait, serve = (steps(plan)[name] for name in ("ray-head", "wait-ray-nodes", "vllm"))
    # Ray takes --node-ip-address as this node's IP and advertises it to the others.
    assert head.argv[head.argv.index("--node-ip-address") + 1] == "10.90.0.1"
    assert wait.argv[wait.argv.index("--address") + 1] == "10.90.0.1:6379"
    assert serve.env["RAY_ADDRESS"] == "10.90.0.1:6379"
    assert not any(HEAD in arg for step in plan.steps for arg in step.argv)
    for step in (head, serve):  # vLLM's Ray workers inherit the raylet's environment
        assert step.env["NCCL_SOCKET_IFNAME"] == "eth1"
        assert step.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
        assert step.env["VLLM_HOST_IP"] == "10.90.0.1"


def test_the_head_without_an_overlay_address_yet_keeps_the_configs_head_address():
    plan = workload(vllm_config(0, head_address="10.90.0.1"), address=None).plan()
    head = steps(plan)["ray-head"]
    assert head.argv[head.argv.index("--node-ip-address") + 1] == "10.90.0.1"
    assert head.env["NCCL_SOCKET_IFNAME"] == "eth1"  # NCCL is still kept off the pod network


def test_without_an_overlay_interface_ray_picks_and_nccl_chooses():
    asked: list[str] = []
    config = vllm_config(1, head_address="127.0.0.1", overlay_interface=None, ib_hca=None)
    ray = steps(workload(config, asked=asked).plan())["ray-worker"]
    assert asked == []
    assert "--node-ip-address" not in ray.argv
    assert not {"VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"} & ray.env.keys()


def test_a_single_node_replica_asks_no_interface_and_sets_no_nccl_settings():
    asked: list[str] = []
    config = vllm_config(0, node_count=1, head_address=None, overlay_interface=None,
                         ib_hca=None)
    plan = workload(config, asked=asked).plan()
    assert [step.name for step in plan.steps] == ["vllm"]
    assert asked == [] and not any(key.startswith("NCCL_") for key in plan.steps[0].env)


@pytest.mark.parametrize("field, value", [
    ("overlay_interface", "eth1; reboot"), ("overlay_interface", "^eth"),
    ("overlay_interface", "eth1,ib0"), ("overlay_interface", "eth1\n"),
    ("overlay_interface", "x" * 16), ("overlay_interface", ".."),
    ("ib_hca", "mlx5 $(reboot)"), ("ib_hca", "mlx5:1:2"), ("ib_hca", "," * 3),
    ("ib_hca", ",".join(["mlx5_0:1"] * 40)),
])
def test_a_config_with_a_hostile_interface_or_hca_is_refused_with_the_field_named(
        tmp_path, field, value):
    data = json.loads(vllm_config(1).to_json())
    data[field] = value
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AgentConfigError, match=field):
        load_agent_config(path)


def test_the_nccl_fields_round_trip_and_are_left_out_when_unset():
    config = vllm_config(1)
    assert AgentConfig.model_validate_json(config.to_json()) == config
    unset = json.loads(vllm_config(1, overlay_interface=None, ib_hca=None).to_json())
    assert "overlay_interface" not in unset and "ib_hca" not in unset


def test_interface_ipv4_reads_loopback_and_answers_none_for_no_such_interface():
    assert interface_ipv4("lo") == "127.0.0.1"
    assert interface_ipv4("cac-missing0") is None


def test_the_masters_and_jobs_arguments_and_environment_reach_vllm_serve(tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_secret\n")
    config = vllm_config(0, node_count=1, head_address=None, overlay_interface=None,
                         ib_hca=None, runtime_args=("--max-model-len", "8192"),
                         runtime_env={"VLLM_ATTENTION_BACKEND": "FLASHINFER"},
                         hub_token_file=str(token), model_cache_dir="/var/cache/models")
    serve = steps(workload(config).plan())["vllm"]
    assert serve.argv[-2:] == ("--max-model-len", "8192")
    assert serve.env["HF_TOKEN"] == "hf_secret"  # the file's line, not the path
    assert serve.env["HF_HOME"] == "/var/cache/models"
    assert serve.env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER"
    assert "hf_secret" not in config.to_json()  # the token is never in the config


def test_an_operators_variable_wins_over_the_cache_folder():
    config = vllm_config(0, node_count=1, head_address=None, overlay_interface=None,
                         ib_hca=None, model_cache_dir="/var/cache/models",
                         runtime_env={"HF_HOME": "/models"})
    assert steps(workload(config).plan())["vllm"].env["HF_HOME"] == "/models"


@pytest.mark.parametrize("content", [None, "", "two\nlines", b"\xff\xfe"])
def test_a_missing_or_bad_hub_token_is_refused_naming_the_file(tmp_path, content):
    from agents.inference.runtimes import InvalidLaunch

    token = tmp_path / "token"
    if isinstance(content, bytes):
        token.write_bytes(content)
    elif content is not None:
        token.write_text(content)
    config = vllm_config(0, node_count=1, head_address=None, overlay_interface=None,
                         ib_hca=None, hub_token_file=str(token))
    with pytest.raises(InvalidLaunch, match=str(token)) as caught:
        workload(config).plan()
    assert caught.value.field == "hub_token_file"


def test_a_flag_the_adapter_sets_in_the_configs_arguments_is_refused():
    from agents.inference.runtimes import ManagedFlagError

    config = vllm_config(0, node_count=1, head_address=None, overlay_interface=None,
                         ib_hca=None, runtime_args=("--port=1",))
    with pytest.raises(ManagedFlagError, match="--port"):
        workload(config).plan()


def test_settings_left_out_of_the_config_file_keep_older_agents_reading_it():
    data = json.loads(vllm_config(0).to_json())
    assert not {"runtime_args", "runtime_env", "hub_token_file", "model_cache_dir"} & set(data)
