"""Model server settings: what a model master and a job may set, how they merge,
and what each refuses, named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts.model import JobSpec
from contracts.runtime_settings import (
    MANAGED_FLAGS,
    ModelRuntimeSettings,
    RuntimeSettings,
    job_env_problem,
    managed_flag_problem,
    merged_runtime_settings,
)


def spec(**fields) -> JobSpec:
    base = {"name": "chat", "team": "ml", "type": "inference", "image": "docker://r/vllm",
            "gpus": 1, "runtime": "vllm", "model": "meta-llama/Llama-3.1-8B"}
    return JobSpec(**{**base, **fields})


def test_a_job_lays_its_arguments_after_and_its_environment_over_the_masters():
    master = ModelRuntimeSettings(args=("--max-model-len", "8192", "--dtype", "bfloat16"),
                                  env={"VLLM_ATTENTION_BACKEND": "FLASHINFER",
                                       "OMP_NUM_THREADS": "4"},
                                  hub_token_secret="hf-token")
    job = RuntimeSettings(args=("--max-model-len", "4096"), env={"OMP_NUM_THREADS": "8"})
    args, env = merged_runtime_settings(master, job)
    # argparse keeps the last value of a repeated flag: the job's.
    assert args == ("--max-model-len", "8192", "--dtype", "bfloat16", "--max-model-len", "4096")
    assert env == {"VLLM_ATTENTION_BACKEND": "FLASHINFER", "OMP_NUM_THREADS": "8"}
    assert merged_runtime_settings(None, None) == ((), {})


@given(st.lists(st.sampled_from(["A", "B", "C"]), max_size=3),
       st.lists(st.sampled_from(["A", "B", "D"]), max_size=3))
def test_a_variable_set_by_both_levels_takes_the_jobs_value(master_names, job_names):
    master = ModelRuntimeSettings(env={name: "master" for name in master_names})
    job = RuntimeSettings(env={name: "job" for name in job_names})
    _, env = merged_runtime_settings(master, job)
    assert set(env) == set(master_names) | set(job_names)
    assert all(env[name] == "job" for name in job_names)
    assert all(env[name] == "master" for name in set(master_names) - set(job_names))


@pytest.mark.parametrize("name", ["HF_ENDPOINT", "HF_TOKEN", "hf_home", "HUGGING_FACE_HUB_TOKEN",
                                  "LD_PRELOAD", "PYTHONPATH", "PATH", "RAY_ADDRESS",
                                  "VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES"])
def test_a_job_may_not_set_what_redirects_the_token_runs_code_or_the_platform_sets(name):
    assert job_env_problem(name) is not None
    with pytest.raises(ValidationError, match="operator can set it on the model master"):
        RuntimeSettings(env={name: "x"})
    assert ModelRuntimeSettings(env={name: "x"}).env == {name: "x"}  # an operator may


@pytest.mark.parametrize("env", [{"1ABC": "x"}, {"A-B": "x"}, {"": "x"}, {"A": "x\x00y"},
                                 {"A": "x" * 4097}])
def test_a_bad_variable_name_or_value_is_refused_at_either_level(env):
    for model in (RuntimeSettings, ModelRuntimeSettings):
        with pytest.raises(ValidationError):
            model(env=env)


@pytest.mark.parametrize("args", [["bad\nline"], [""], ["x" * 1025], ["a"] * 65])
def test_bad_arguments_are_refused(args):
    with pytest.raises(ValidationError):
        RuntimeSettings(args=args)


@pytest.mark.parametrize(("runtime", "arg"), [
    ("vllm", "--port"), ("vllm", "--port=9"), ("vllm", "--por"), ("vllm", "-tp"),
    ("vllm", "--served-model-name=x"), ("parakeet", "--device"), ("local", "--served-name"),
])
def test_a_flag_the_platform_sets_is_refused_in_any_spelling(runtime, arg):
    assert managed_flag_problem(runtime, [arg]) is not None
    with pytest.raises(ValidationError, match="which the platform sets"):
        spec(runtime=runtime, runtime_settings={"args": [arg, "1"]})
    with pytest.raises(ValidationError, match="which the platform sets"):
        spec(runtime=runtime, model_settings={"args": [arg, "1"]})


def test_other_flags_and_values_pass():
    assert managed_flag_problem("vllm", ["--max-model-len", "8192", "--quantization", "awq",
                                         "--port-ish-value"]) is None
    assert managed_flag_problem("vllm", ["--host"]) is not None
    assert set(MANAGED_FLAGS) == {"vllm", "parakeet", "local"}


def test_a_container_job_takes_no_runtime_settings():
    with pytest.raises(ValidationError, match="takes no runtime settings"):
        spec(type="container", runtime=None, model=None,
             runtime_settings={"args": ["--max-model-len", "8"]})


def test_the_hub_token_is_a_secret_name_never_a_token():
    assert spec(model_settings={"hub_token_secret": "hf-token"}).model_settings.hub_token_secret \
        == "hf-token"
    for bad in ("hf_AbCdEf", "Has-Upper", "-lead", "a" * 254):
        with pytest.raises(ValidationError):
            ModelRuntimeSettings(hub_token_secret=bad)
    with pytest.raises(ValidationError):  # only the master names a Secret
        RuntimeSettings(hub_token_secret="hf-token")


def test_a_spec_without_settings_reads_as_before_to_an_older_peer():
    """Older wrk-ork, app-node and workers forbid unknown fields: a spec that has no
    settings carries no key for them (seen: a new wrk-ork's answer refused by an
    older app-node, 'extra_forbidden')."""
    data = spec().model_dump(mode="json")
    assert "runtime_settings" not in data and "model_settings" not in data
    assert JobSpec.model_validate_json(spec().model_dump_json()) == spec()
    tuned = spec(runtime_settings={"args": ["--max-model-len", "64"]})
    assert tuned.model_dump(mode="json")["runtime_settings"] == {
        "args": ["--max-model-len", "64"], "env": {}}
    assert JobSpec.model_validate(tuned.model_dump(mode="json")) == tuned
