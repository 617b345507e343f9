"""The rule of what each job type holds is written once (contracts.model.job_type_problem):
JobSpec and app-node's API refuse the same bodies, the API naming the field."""

import pytest
from pydantic import ValidationError

from contracts.model import JobSpec, JobType, Runtime, job_type_problem

IMAGE = "docker://registry.local/img:1"
KEY = "ab" * 32


@pytest.mark.parametrize(("fields", "field"), [
    ({"type": "container", "model": "m"}, "model"),
    ({"type": "container", "runtime": "vllm"}, "runtime"),
    ({"type": "container", "served_name": "chat"}, "served_name"),
    ({"type": "container", "replicas": 2}, "replicas"),
    ({"type": "inference", "model": "m"}, "runtime"),
    ({"type": "inference", "runtime": "vllm"}, "model"),
    ({"type": "inference", "runtime": "vllm", "model": "m", "authorized_keys": (KEY,)},
     "authorized_keys"),
])
def test_jobspec_refuses_what_the_rule_names(fields: dict, field: str) -> None:
    problem = job_type_problem(JobType(fields["type"]), runtime=fields.get("runtime"),
                               model=fields.get("model"),
                               served_name=fields.get("served_name"),
                               replicas=fields.get("replicas", 1),
                               authorized_keys=fields.get("authorized_keys", ()))
    assert problem is not None and problem[0] == field
    with pytest.raises(ValidationError, match=problem[1].split(" (")[0]):
        JobSpec(name="j", team="t", image=IMAGE, gpus=1, **fields)


def test_well_formed_jobs_of_each_type_pass() -> None:
    assert job_type_problem(JobType.CONTAINER, runtime=None, model=None, served_name=None,
                            authorized_keys=(KEY,)) is None
    assert job_type_problem(JobType.INFERENCE, runtime=Runtime.VLLM, model="m",
                            served_name="chat", replicas=3) is None
