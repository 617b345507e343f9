"""The overlay's NetworkAttachmentDefinition as ``cosmicac k8s overlay`` renders it,
and the doctor reading it back from the API double as it would from a cluster."""

from __future__ import annotations

import json

import pytest
import trio
import yaml
from typer.testing import CliRunner

from cli.main import app
from nodes.k8s_worker.kubevirt.doctor import Status, run_doctor
from nodes.k8s_worker.kubevirt.overlay import OverlayError, render_overlay_nad
from nodes.k8s_worker.kubevirt.settings import KubevirtSettings

from . import test_kubevirt_backend as flows
from .doctor_cluster import NAD, SETTINGS, ready_cluster, serve

double = flows.double


def _config(manifest) -> dict:
    return json.loads(manifest["spec"]["config"])


def test_the_bridge_binding_is_ovs_cni_on_the_nodes_bridge_with_cluster_wide_addresses():
    manifest = render_overlay_nad(KubevirtSettings(overlay_network="cosmicac/vllm-overlay",
                                                   overlay_mtu=8950))
    assert (manifest["apiVersion"], manifest["kind"]) == ("k8s.cni.cncf.io/v1",
                                                         "NetworkAttachmentDefinition")
    assert manifest["metadata"]["name"] == "vllm-overlay"
    assert manifest["metadata"]["namespace"] == "cosmicac"
    assert _config(manifest) == {"cniVersion": "0.4.0", "name": "vllm-overlay", "type": "ovs",
                                 "bridge": "br-overlay", "mtu": 8950,
                                 "ipam": {"type": "whereabouts", "range": "10.90.0.0/16"}}


def test_the_sriov_binding_claims_a_vf_of_the_named_resource():
    settings = KubevirtSettings(overlay_network="other/ib-net", overlay_binding="sriov",
                                overlay_sriov_resource="nvidia.com/cx7_vf")
    manifest = render_overlay_nad(settings)
    assert manifest["metadata"]["namespace"] == "other"
    assert manifest["metadata"]["annotations"] == {
        "k8s.v1.cni.cncf.io/resourceName": "nvidia.com/cx7_vf"}
    assert _config(manifest)["type"] == "sriov" and "bridge" not in _config(manifest)


@pytest.mark.parametrize(("settings", "words"), [
    ({}, "overlay_network is not set"),
    ({"overlay_network": "n", "overlay_binding": "sriov"}, "overlay_sriov_resource"),
    ({"overlay_network": "n", "overlay_subnet": "10.90.0.1/16"}, "overlay_subnet"),
])
def test_what_is_missing_is_named(settings, words):
    with pytest.raises(OverlayError, match=words):
        render_overlay_nad(KubevirtSettings(**settings))


def test_the_command_prints_what_kubectl_applies(tmp_path):
    settings = tmp_path / "kubevirt.json"
    settings.write_text(json.dumps({"namespace": "gpu-jobs", "overlay_network": "vllm-overlay",
                                    "overlay_subnet": "10.91.0.0/16"}))
    result = CliRunner().invoke(app, ["k8s", "overlay", "--settings", str(settings)])
    assert result.exit_code == 0, result.output
    (manifest,) = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert manifest["metadata"] == {"name": "vllm-overlay", "namespace": "gpu-jobs",
                                    "labels": {"app.kubernetes.io/managed-by": "cosmicac"}}
    assert _config(manifest)["ipam"]["range"] == "10.91.0.0/16"
    bad = CliRunner().invoke(app, ["k8s", "overlay", "--overlay-network", "n", "--settings",
                                   str(settings), "--namespace", "x"])
    assert bad.exit_code == 0  # a namespace and a name given: fine
    sriov = tmp_path / "sriov.json"
    sriov.write_text(json.dumps({"overlay_network": "n", "overlay_binding": "sriov"}))
    refused = CliRunner().invoke(app, ["k8s", "overlay", "--settings", str(sriov)])
    assert refused.exit_code == 1 and "overlay_sriov_resource" in refused.output


@pytest.mark.slow
async def test_the_doctor_takes_the_rendered_attachment_as_the_overlay(double):
    objects = ready_cluster()
    objects["nad"] = (NAD, render_overlay_nad(SETTINGS))
    serve(double, objects)
    with trio.fail_after(20):
        checks = await run_doctor(SETTINGS, api_client_factory=double.api_client)
    (overlay,) = [c for c in checks if c.name.startswith("overlay network")]
    assert overlay.status is Status.OK and "CNI ovs" in overlay.detail
