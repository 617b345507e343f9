"""``cosmicac doctor``'s checks against the API double: a ready cluster, then each way it is not.

Each case takes one thing away from a ready cluster (or changes one setting)
and names exactly the checks that must fail: nothing else may fail with it.
Real sockets and client threads: every run is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import logging

import pytest
import trio

from nodes.k8s_worker.kubevirt.doctor import (
    ApiUnreachable,
    Check,
    SettingsError,
    Status,
    exit_code,
    run_doctor,
    warn_at_start,
)
from nodes.k8s_worker.kubevirt.permissions import PERMISSIONS

from . import test_kubevirt_backend as flows
from .doctor_cluster import (
    CDI,
    IB,
    KUBEVIRT,
    NAD,
    SETTINGS,
    closed_port,
    ready_cluster,
    serve,
)
from .units import H100

pytestmark = pytest.mark.slow

double = flows.double  # the backend tests' nodes: two H100 nodes with an HCA each
LIMIT_S = 20


async def _doctor(double, settings=SETTINGS) -> list[Check]:
    with trio.fail_after(LIMIT_S):
        return await run_doctor(settings, api_client_factory=double.api_client)


def _failed(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks if c.status is Status.FAILED}


async def test_a_ready_cluster_passes_every_check(double):
    serve(double, ready_cluster())
    checks = await _doctor(double)
    assert [c for c in checks if c.status is not Status.OK] == [], checks
    assert exit_code(checks) == 0
    lines = {c.name: c.detail for c in checks}
    assert "Kubernetes v1.31.0-double" in lines["Kubernetes API"]
    assert lines["KubeVirt"] == "v1.3.1, Deployed (kubevirt/kubevirt)"
    assert lines["CDI"] == "v1.60.3, Deployed (cdi)"
    assert lines["GPUs on nodes"] == f"24 on 3 node(s) ({H100})"
    assert lines["storage class for root disks"].startswith(
        "ceph-rbd (the cluster's default, rbd.csi.ceph.com); binds on first consumer")
    assert "cosmicac/vllm-overlay exists (CNI ovs-cni" in \
        lines["overlay network (multi-node replicas)"]
    assert lines["InfiniBand on nodes"] == f"{IB} on gpu-node-1, gpu-node-2"
    assert sum(c.name.startswith("may ") for c in checks) == len(PERMISSIONS)


def _without(name):
    def change(objects, double):
        del objects[name]
    return change


def _unserved(api_plural):
    def change(objects, double):
        double.unserved.add(api_plural)
    return change


def _kubevirt_config(update):
    def change(objects, double):
        update(objects["kubevirt"][1])
    return change


def _deploying(kubevirt):
    kubevirt["status"]["phase"] = "Deploying"


def _no_h100(kubevirt):
    devices = kubevirt["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    devices[:] = [d for d in devices if d["resourceName"] != H100]


def _gate_off(kubevirt):
    kubevirt["spec"]["configuration"]["developerConfiguration"]["featureGates"] = []


def _deny(*denied):
    def change(objects, double):
        double.allowed = {(p.group, p.resource, p.verb) for p in PERMISSIONS} - set(denied)
    return change


def _not_default(objects, double):
    objects["storage"][1]["metadata"]["annotations"] = {}


def _no_change(objects, double):
    pass


PERMITTED = "GPUs permitted by KubeVirt"
IB_PERMITTED = "InfiniBand permitted by KubeVirt"
STORAGE = "storage class for root disks"
OVERLAY = "overlay network (multi-node replicas)"

#: (case, change to the ready cluster, settings changed, the checks that fail, words)
CASES = [
    ("no KubeVirt", _unserved(KUBEVIRT), {}, {"KubeVirt": "not installed"}),
    ("no KubeVirt CR", _without("kubevirt"), {}, {"KubeVirt": "no kubevirts.kubevirt.io"}),
    ("KubeVirt deploying", _kubevirt_config(_deploying), {},
     {"KubeVirt": "v1.3.1, Deploying (not Deployed"}),
    ("no CDI", _unserved(CDI), {}, {"CDI": "not installed"}),
    ("a permission denied", _deny(("", "secrets", "update")), {},
     {"may update secrets in namespace cosmicac": "denied"}),
    ("a cluster permission denied", _deny(("", "nodes", "list")), {},
     {"may list nodes cluster-wide": "denied"}),
    ("no GPU resource", _no_change, {"gpu_resource": "nvidia.com/A100"},
     {"GPUs on nodes": "no node has allocatable nvidia.com/A100"}),
    ("GPUs not permitted", _kubevirt_config(_no_h100), {},
     {PERMITTED: f"{H100} not in permittedHostDevices"}),
    ("no default storage class", _not_default, {},
     {STORAGE: "storage_class is not set and the cluster has no default class"}),
    ("the configured class missing", _no_change, {"storage_class": "fast-nvme"},
     {STORAGE: "storage_class 'fast-nvme' does not exist (classes: ceph-rbd)"}),
    ("missing NAD", _without("nad"), {},
     {OVERLAY: "NetworkAttachmentDefinition cosmicac/vllm-overlay does not exist"}),
    ("no Multus", _unserved(NAD), {}, {OVERLAY: "Multus is not installed"}),
    ("no InfiniBand resource", _no_change, {"infiniband_resource": "nvidia.com/hca"},
     {"InfiniBand on nodes": "no node has allocatable nvidia.com/hca",
      IB_PERMITTED: "nvidia.com/hca not in permittedHostDevices"}),
    ("HostDevices gate off", _kubevirt_config(_gate_off), {},
     {IB_PERMITTED: "the HostDevices feature gate is off"}),
]


@pytest.mark.parametrize("change, settings, failing", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
async def test_each_missing_requirement_fails_its_own_check_and_says_what_to_do(
        double, change, settings, failing):
    objects = ready_cluster()
    change(objects, double)
    serve(double, objects)
    checks = await _doctor(double, SETTINGS.model_copy(update=settings))
    failed = _failed(checks)
    assert set(failed) == set(failing), [c.line() for c in checks]
    for name, words in failing.items():
        assert words in failed[name].detail
        assert failed[name].fix
    assert exit_code(checks) == 1


async def test_without_the_kubevirt_cr_the_device_checks_say_they_could_not_look(double):
    objects = ready_cluster()
    del objects["kubevirt"]
    serve(double, objects)
    checks = {c.name: c for c in await _doctor(double)}
    assert checks[PERMITTED].status is Status.WARNING
    assert checks[IB_PERMITTED].status is Status.WARNING


async def test_without_an_overlay_the_multi_node_lines_are_advice(double):
    serve(double, ready_cluster())
    settings = SETTINGS.model_copy(update={"overlay_network": None,
                                           "infiniband_resource": None})
    checks = await _doctor(double, settings)
    assert exit_code(checks) == 0
    assert [c.name for c in checks if c.status is Status.WARNING] == [OVERLAY]
    assert not any(c.name.startswith("may get network-attachment") for c in checks)



async def test_an_unreachable_api_server_is_its_own_error(double):
    double.url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(ApiUnreachable) as caught:
        await _doctor(double)
    assert caught.value.server == double.url and "127.0.0.1" in str(caught.value)
    assert not double.accesses  # nothing reached the (real) double


async def test_no_kubeconfig_is_a_settings_error(tmp_path):
    settings = SETTINGS.model_copy(update={"kubeconfig": str(tmp_path / "absent")})
    with pytest.raises(SettingsError, match="no Kubernetes configuration"):
        await run_doctor(settings)


async def test_the_worker_start_logs_failed_checks_as_warnings(double, caplog):
    objects = ready_cluster()
    del objects["nad"]
    serve(double, objects)
    caplog.set_level(logging.INFO, logger="nodes.k8s_worker.kubevirt.doctor")
    checks = await warn_at_start(SETTINGS, api_client_factory=double.api_client,
                                 timeout_s=LIMIT_S)
    assert exit_code(checks) == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.args[0] for r in warnings] == [OVERLAY]
    assert "doctor.done" in caplog.records[-1].getMessage()


async def test_the_worker_start_survives_an_unreachable_cluster(double, caplog):
    double.url = f"http://127.0.0.1:{closed_port()}"
    caplog.set_level(logging.WARNING, logger="nodes.k8s_worker.kubevirt.doctor")
    assert await warn_at_start(SETTINGS, api_client_factory=double.api_client,
                               timeout_s=LIMIT_S) == []
    assert "doctor.not_run" in caplog.records[-1].getMessage()


async def test_a_model_cache_without_kubevirts_virtiofs_gate_is_a_warning_that_says_which(
        double):
    settings = SETTINGS.model_copy(update={"model_cache_claim": "model-cache"})
    serve(double, ready_cluster())
    (cache,) = [c for c in await _doctor(double, settings) if c.name.startswith("model cache")]
    assert cache.status is Status.WARNING and "EnableVirtioFsPVC" in cache.fix
    objects = ready_cluster()
    gates = objects["kubevirt"][1]["spec"]["configuration"]["developerConfiguration"]
    gates["featureGates"].append("EnableVirtioFsPVC")
    serve(double, objects)
    checks = await _doctor(double, settings)
    (cache,) = [c for c in checks if c.name.startswith("model cache")]
    assert cache.status is Status.OK and "model-cache" in cache.detail
    assert exit_code(checks) == 0
    # No claim configured: no line at all.
    assert not [c for c in await _doctor(double) if c.name.startswith("model cache")]
