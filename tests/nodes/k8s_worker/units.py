"""Replicas for the kubevirt tests: a container job, a vLLM replica over two nodes."""

from __future__ import annotations

from contracts.model import JobSpec, NodeShare, ReplicaPlacement
from nodes.k8s_worker.backend import ReplicaUnit
from nodes.k8s_worker.kubevirt.render import replica_unit

RACK = "ab" * 32
WORKER = "cd" * 32
TOKEN = "ef" * 32
H100 = "nvidia.com/GH100_H100_SXM5_80GB"
IMAGE = "docker://registry.example/cosmicac/ubuntu-cuda:12.4"


def container_unit(job_id: str = "j-00112233aabbccdd", node: str = "gpu-node-1",
                   gpus: int = 1, generation: int = 0) -> ReplicaUnit:
    spec = JobSpec(name="demo", team="t1", type="container", image=IMAGE, gpus=gpus)
    placement = ReplicaPlacement(rack=RACK, shares=(NodeShare(node=node, gpus=gpus),))
    return replica_unit(job_id, 0, spec, placement, generation=generation,
                        agent={"worker": WORKER, "report_token": TOKEN})


#: A model master's settings with a hub token Secret, as an operator would give them.
MODEL_SETTINGS = {"args": ["--max-model-len", "8192", "--dtype", "bfloat16"],
                  "env": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"},
                  "hub_token_secret": "hf-token"}


def vllm_unit(job_id: str = "j-4455667788990011", replica: int = 0,
              nodes: tuple[str, ...] = ("gpu-node-1", "gpu-node-2"),
              generation: int = 0, **spec_fields) -> ReplicaUnit:
    """A vLLM replica over ``nodes``; ``spec_fields`` add to its JobSpec
    (``runtime_settings``, ``model_settings``)."""
    spec = JobSpec(name="llama", team="t1", type="inference", image=IMAGE,
                   gpus=8 * len(nodes), runtime="vllm", model="meta-llama/Llama-3.1-70B",
                   **spec_fields)
    placement = ReplicaPlacement(rack=RACK, shares=tuple(NodeShare(node=n, gpus=8)
                                                         for n in nodes))
    return replica_unit(job_id, replica, spec, placement, generation=generation,
                        agent={"worker": WORKER, "report_token": TOKEN,
                               "bootstrap": ("10.0.0.1:49737",)})


def isolated_unit(job_id: str = "j-8899aabbccddeeff", members: tuple[bytes, ...] = (),
                  generation: int = 0) -> ReplicaUnit:
    """A one-GPU container job on an isolated network, ``members`` its team's CLI keys."""
    keys = tuple(key.hex() for key in members)
    spec = JobSpec(name="private", team="t1", type="container", image=IMAGE, gpus=1,
                   isolated_network=True, authorized_keys=keys)
    placement = ReplicaPlacement(rack=RACK, shares=(NodeShare(node="gpu-node-1", gpus=1),))
    return replica_unit(job_id, 0, spec, placement, generation=generation,
                        agent={"worker": WORKER, "report_token": TOKEN, "authorized_keys": keys})
