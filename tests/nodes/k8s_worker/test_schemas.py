"""Every rendered object validates strictly against the upstream OpenAPI schemas."""

import copy

import jsonschema
import pytest

from nodes.k8s_worker.kubevirt.render import render_replica
from nodes.k8s_worker.kubevirt.settings import KubevirtSettings

from .schema_check import validate
from .units import H100, MODEL_SETTINGS, container_unit, vllm_unit

SETTINGS = KubevirtSettings(overlay_network="cosmicac/vllm-overlay",
                            infiniband_resource="nvidia.com/mlx5_ib", storage_class="ceph-rbd",
                            access_modes=("ReadWriteOnce",), volume_mode="Block",
                            registry_secret="regcred", registry_cert_configmap="registry-ca")
NODES = {"gpu-node-1": H100, "gpu-node-2": H100}


def _all():
    return (render_replica(container_unit(gpus=8), SETTINGS, gpu_resources=NODES)
            + render_replica(vllm_unit(), SETTINGS, gpu_resources=NODES)
            + render_replica(container_unit(), KubevirtSettings(), gpu_resources=NODES)
            + render_replica(vllm_unit(nodes=("gpu-node-1",), model_settings=MODEL_SETTINGS),
                             KubevirtSettings(model_cache_claim="model-cache"),
                             gpu_resources=NODES))


@pytest.mark.parametrize("index", range(len(_all())))
def test_rendered_object_is_valid(index):
    validate(_all()[index])


def test_every_kind_is_among_the_rendered_objects():
    assert {m["kind"] for m in _all()} == {"Service", "Secret", "DataVolume",
                                            "VirtualMachineInstance"}
    # Service + 2 x 3 (a two-node vLLM replica) beside two one-node containers and a
    # one-node vLLM replica (hub token, model cache) of 3.
    assert len(_all()) == 16


@pytest.mark.parametrize("kind, path", [
    ("VirtualMachineInstance", ("spec", "domain", "devices", "gpus", 0)),
    ("VirtualMachineInstance", ("spec",)),
    ("VirtualMachineInstance", ("spec", "domain", "devices", "interfaces", 0, "masquerade")),
    ("VirtualMachineInstance", ("spec", "networks", 0, "pod")),
    ("DataVolume", ("spec", "source", "registry")),
    ("DataVolume", ("metadata",)),
    ("Secret", ()),
    ("Secret", ("metadata",)),
    ("Service", ("spec",)),
    ("Service", ("spec", "ports", 0)),
])
def test_an_undeclared_field_fails(kind, path):
    manifest = copy.deepcopy(next(m for m in _all() if m["kind"] == kind))
    target = manifest
    for step in path:
        target = target[step]
    target["surprise"] = "x"
    with pytest.raises((jsonschema.ValidationError, AssertionError)):
        validate(manifest)


def test_a_wrong_type_fails():
    vmi = copy.deepcopy(next(m for m in _all() if m["kind"] == "VirtualMachineInstance"))
    vmi["spec"]["domain"]["cpu"]["cores"] = "eight"
    with pytest.raises(jsonschema.ValidationError):
        validate(vmi)
    secret = copy.deepcopy(next(m for m in _all() if m["kind"] == "Secret"))
    secret["data"]["userdata"] = 3
    with pytest.raises(AssertionError):
        validate(secret)
    service = copy.deepcopy(next(m for m in _all() if m["kind"] == "Service"))
    service["spec"]["ports"][0]["port"] = "6379"
    with pytest.raises(AssertionError, match="port"):
        validate(service)
