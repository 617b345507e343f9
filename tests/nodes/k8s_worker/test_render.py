"""What the kubevirt backend renders: the objects, their links, the cloud-init payload."""

import base64
import json
import subprocess

import pytest
import yaml

from agents.inference.runtimes import DEFAULT_RAY_PORT
from contracts.agent_config import AGENT_CONFIG_PATH, AgentConfig
from nodes.k8s_worker.kubevirt.render import (
    LABEL_MANAGED_BY,
    RAY_GCS_PORT,
    cloud_init_user_data,
    render_replica,
    render_vmi,
    secret_name,
    service_name,
)
from nodes.k8s_worker.kubevirt.settings import KubevirtSettings

from .units import H100, container_unit, vllm_unit

MULTI = KubevirtSettings(overlay_network="cosmicac/vllm-overlay",
                         infiniband_resource="nvidia.com/mlx5_ib")


def _by_kind(manifests, kind):
    return [m for m in manifests if m["kind"] == kind]


def _agent_configs(manifests):
    """The agent config each Secret's user data writes, in VMI order."""
    return [json.loads(yaml.safe_load(base64.b64decode(s["data"]["userdata"]))
                       ["write_files"][0]["content"]) for s in _by_kind(manifests, "Secret")]


def test_container_replica_is_secret_datavolume_vmi_in_that_order():
    unit = container_unit(gpus=2)
    manifests = render_replica(unit, KubevirtSettings(), gpu_resources={"gpu-node-1": H100})
    assert [m["kind"] for m in manifests] == ["Secret", "DataVolume", "VirtualMachineInstance"]
    secret, dv, vmi = manifests
    name = unit.vmis[0].name
    assert vmi["metadata"]["name"] == name and dv["metadata"]["name"] == unit.vmis[0].disk
    assert secret["metadata"]["name"] == secret_name(name)
    assert all(m["metadata"]["namespace"] == "cosmicac" for m in manifests)
    assert all(m["metadata"]["labels"][LABEL_MANAGED_BY] == "cosmicac" for m in manifests)
    spec = vmi["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-1"}
    # One gpus entry per whole GPU; GPUs never appear in resources.
    assert spec["domain"]["devices"]["gpus"] == [{"name": "gpu0", "deviceName": H100},
                                                 {"name": "gpu1", "deviceName": H100}]
    assert "resources" not in spec["domain"] and "hostDevices" not in spec["domain"]["devices"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["root"]["dataVolume"] == {"name": dv["metadata"]["name"]}
    assert volumes["cloudinit"]["cloudInitNoCloud"] == {"secretRef": {"name": secret_name(name)}}
    assert [n["name"] for n in spec["networks"]] == ["default"]
    assert dv["spec"]["source"]["registry"]["url"] == unit.spec.image
    assert dv["spec"]["storage"]["resources"]["requests"]["storage"] == "100Gi"
    assert spec["domain"]["cpu"]["cores"] == 16 and spec["domain"]["memory"]["guest"] == "128Gi"


def test_secret_carries_a_cloud_config_that_writes_the_agent_config_and_starts_it():
    unit = container_unit()
    secret = render_replica(unit, KubevirtSettings(), gpu_resources={"gpu-node-1": H100})[0]
    user_data = base64.b64decode(secret["data"]["userdata"]).decode()
    assert user_data.startswith("#cloud-config\n")
    document = yaml.safe_load(user_data)
    (file,) = document["write_files"]
    assert file["path"] == AGENT_CONFIG_PATH and file["permissions"] == "0600"
    assert AgentConfig.model_validate(json.loads(file["content"])) == unit.vmis[0].agent
    (start,) = document["runcmd"]
    assert start[:3] == ["systemd-run", "--no-block", "--unit=cosmicac-agent"]
    assert start[start.index("--") + 1:] == ["cosmicac", "agent", "run", "--config",
                                             AGENT_CONFIG_PATH]


def _boot(tmp_path, user_data):
    """Run the user data's bootcmd as cloud-init would, with a recording systemd-run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "systemd-run"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD"\n')
    fake.chmod(0o755)
    (command,) = yaml.safe_load(user_data)["bootcmd"]
    path = tmp_path / "agent.json"
    command[command.index(AGENT_CONFIG_PATH)] = str(path)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(tmp_path / "record")}
    subprocess.run(command, env=env, check=True, timeout=30)
    return path


def test_bootcmd_does_nothing_on_first_boot_and_renews_the_config_on_later_ones(tmp_path):
    first = container_unit().vmis[0].agent
    path = _boot(tmp_path, cloud_init_user_data(first))
    assert not path.exists() and not (tmp_path / "record").exists()
    # A restart: the kept disk has the old config; this boot's user data has the new one.
    path.write_text(first.to_json())
    renewed = container_unit(generation=1).vmis[0].agent.model_copy(
        update={"model": None, "report_token": "12" * 32})
    _boot(tmp_path, cloud_init_user_data(renewed))
    assert AgentConfig.model_validate_json(path.read_text()) == renewed
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    args = (tmp_path / "record").read_text().splitlines()
    assert args[args.index("--") + 1:] == ["cosmicac", "agent", "run", "--config", str(path)]


def test_user_data_survives_hostile_strings_in_the_config():
    agent = container_unit().vmis[0].agent.model_copy(
        update={"model": "x\n- runcmd: [rm, -rf, /]\n'\"#"})
    document = yaml.safe_load(cloud_init_user_data(agent))
    assert json.loads(document["write_files"][0]["content"])["model"] == agent.model


def test_multi_node_vmis_join_the_overlay_and_claim_infiniband():
    unit = vllm_unit()
    manifests = render_replica(unit, MULTI, gpu_resources=dict.fromkeys(
        ("gpu-node-1", "gpu-node-2"), H100))
    vmis = _by_kind(manifests, "VirtualMachineInstance")
    assert [v["spec"]["nodeSelector"]["kubernetes.io/hostname"] for v in vmis] == [
        "gpu-node-1", "gpu-node-2"]
    for rank, vmi in enumerate(vmis):
        spec = vmi["spec"]
        assert len(spec["domain"]["devices"]["gpus"]) == 8
        assert spec["networks"][1] == {"name": "overlay",
                                       "multus": {"networkName": "cosmicac/vllm-overlay"}}
        assert {"name": "overlay", "bridge": {}} in spec["domain"]["devices"]["interfaces"]
        assert spec["domain"]["devices"]["hostDevices"] == [
            {"name": "ib0", "deviceName": "nvidia.com/mlx5_ib"}]
        assert vmi["metadata"]["labels"]["cosmicac.io/node-rank"] == str(rank)
    assert [config["node_rank"] for config in _agent_configs(manifests)] == [0, 1]


def test_multi_node_replica_starts_with_a_headless_service_its_vmis_are_a_subdomain_of():
    unit = vllm_unit(job_id="j-4455667788990011", replica=3)
    manifests = render_replica(unit, MULTI, gpu_resources=dict.fromkeys(
        ("gpu-node-1", "gpu-node-2"), H100))
    assert [m["kind"] for m in manifests] == ["Service"] + [
        "Secret", "DataVolume", "VirtualMachineInstance"] * 2
    service = manifests[0]
    assert service_name(unit) == service["metadata"]["name"] == "cac-4455667788990011-r3"
    assert service["metadata"]["namespace"] == "cosmicac"
    assert service["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"app.kubernetes.io/managed-by": "cosmicac",
                     "cosmicac.io/job": "j-4455667788990011", "cosmicac.io/replica": "3",
                     "kubevirt.io": "virt-launcher"},
        "ports": [{"name": "ray-gcs", "port": 6379, "targetPort": 6379, "protocol": "TCP"}],
    }
    for vmi in _by_kind(manifests, "VirtualMachineInstance"):
        # The selector matches every VMI's labels (KubeVirt copies them to the
        # launcher pod, which adds kubevirt.io=virt-launcher itself).
        labels = {**vmi["metadata"]["labels"], "kubevirt.io": "virt-launcher"}
        assert service["spec"]["selector"].items() <= labels.items()
        assert vmi["spec"]["hostname"] == vmi["metadata"]["name"]
        assert vmi["spec"]["subdomain"] == "cac-4455667788990011-r3"


def test_the_service_port_is_the_one_the_vllm_adapter_starts_rays_head_on():
    assert RAY_GCS_PORT == DEFAULT_RAY_PORT


def test_every_rank_names_the_head_by_its_cluster_dns_name_and_gets_nccl_settings():
    unit = vllm_unit(replica=1)
    settings = MULTI.model_copy(update={"namespace": "gpu-jobs",
                                        "cluster_domain": "k8s.example.org",
                                        "overlay_interface": "enp2s0",
                                        "infiniband_hca": "=mlx5_0:1,mlx5_1:1"})
    configs = _agent_configs(render_replica(unit, settings, gpu_resources=dict.fromkeys(
        ("gpu-node-1", "gpu-node-2"), H100)))
    head = "cac-4455667788990011-r1-n0.cac-4455667788990011-r1.gpu-jobs.svc.k8s.example.org"
    assert [c["head_address"] for c in configs] == [head, head]
    assert [c["overlay_interface"] for c in configs] == ["enp2s0", "enp2s0"]
    assert [c["ib_hca"] for c in configs] == ["=mlx5_0:1,mlx5_1:1"] * 2
    # The unit itself (what the local and qemu backends render) is left alone.
    assert unit.vmis[1].agent.head_address == "cac-4455667788990011-r1-n0"
    assert unit.vmis[1].agent.overlay_interface is None


def test_defaults_are_cluster_local_eth1_and_mlx5():
    configs = _agent_configs(render_replica(vllm_unit(), MULTI, gpu_resources=dict.fromkeys(
        ("gpu-node-1", "gpu-node-2"), H100)))
    assert configs[1]["head_address"] == ("cac-4455667788990011-r0-n0.cac-4455667788990011-r0"
                                          ".cosmicac.svc.cluster.local")
    assert (configs[1]["overlay_interface"], configs[1]["ib_hca"]) == ("eth1", "mlx5")


def test_a_single_node_replica_gets_no_service_no_subdomain_and_no_nccl_settings():
    manifests = render_replica(container_unit(), MULTI, gpu_resources={"gpu-node-1": H100})
    assert not _by_kind(manifests, "Service")
    assert "subdomain" not in _by_kind(manifests, "VirtualMachineInstance")[0]["spec"]
    (config,) = _agent_configs(manifests)
    assert "head_address" in config and config["head_address"] is None
    # Fields added after version 1 are left out when unset: an older agent image reads it.
    assert "overlay_interface" not in config and "ib_hca" not in config


@pytest.mark.parametrize("field, value", [
    ("overlay_interface", "eth1;reboot"), ("overlay_interface", "^eth"),
    ("overlay_interface", "an-interface-name-too-long"), ("overlay_interface", ".."),
    ("infiniband_hca", "mlx5 mlx4"), ("infiniband_hca", "mlx5,"), ("infiniband_hca", ""),
    ("cluster_domain", "Cluster.Local"), ("cluster_domain", "cluster..local"),
])
def test_settings_refuse_a_bad_interface_hca_or_cluster_domain(field, value):
    with pytest.raises(ValueError, match=field):
        KubevirtSettings(**{field: value})


def test_multi_node_without_overlay_configured_is_refused():
    unit = vllm_unit()
    with pytest.raises(ValueError, match="overlay_network"):
        render_vmi(unit, unit.vmis[0], KubevirtSettings(), gpu_resource=H100)


def test_unknown_node_resource_is_refused():
    with pytest.raises(ValueError, match="gpu-node-1"):
        render_replica(container_unit(), KubevirtSettings(), gpu_resources={})


def test_storage_and_pull_settings_reach_the_datavolume():
    settings = KubevirtSettings(storage_class="ceph-rbd", disk_size="250Gi",
                                access_modes=("ReadWriteMany",), volume_mode="Block",
                                pull_method="node", registry_secret="regcred",
                                registry_cert_configmap="registry-ca", namespace="gpu")
    dv = render_replica(container_unit(), settings, gpu_resources={"gpu-node-1": H100})[1]
    assert dv["metadata"]["namespace"] == "gpu"
    assert dv["spec"]["source"]["registry"] == {
        "url": container_unit().spec.image, "pullMethod": "node", "secretRef": "regcred",
        "certConfigMap": "registry-ca"}
    assert dv["spec"]["storage"] == {"resources": {"requests": {"storage": "250Gi"}},
                                     "storageClassName": "ceph-rbd",
                                     "accessModes": ["ReadWriteMany"], "volumeMode": "Block"}


def test_settings_refuse_a_bad_quantity_and_unknown_fields():
    with pytest.raises(ValueError, match="quantity"):
        KubevirtSettings(disk_size="lots")
    with pytest.raises(ValueError):
        KubevirtSettings(namespce="typo")


def test_a_models_hub_token_secret_is_a_disk_the_guest_mounts_and_the_config_names():
    from .units import MODEL_SETTINGS

    unit = vllm_unit(nodes=("gpu-node-1",), model_settings=MODEL_SETTINGS,
                     runtime_settings={"args": ["--quantization", "awq"]})
    secret, _, vmi = render_replica(unit, KubevirtSettings(), gpu_resources={"gpu-node-1": H100})
    devices, volumes = vmi["spec"]["domain"]["devices"], vmi["spec"]["volumes"]
    assert {"name": "hub-token", "serial": "cac-hub-token", "disk": {"bus": "virtio"}} \
        in devices["disks"]
    assert {"name": "hub-token", "secret": {"secretName": "hf-token"}} in volumes
    assert "filesystems" not in devices  # no model cache configured
    user_data = yaml.safe_load(base64.b64decode(secret["data"]["userdata"]))
    config = json.loads(user_data["write_files"][0]["content"])
    assert config["hub_token_file"] == "/run/cosmicac/hub-token/token"
    assert "model_cache_dir" not in config
    # The master's arguments, then the job's; the master's environment.
    assert config["runtime_args"] == ["--max-model-len", "8192", "--dtype", "bfloat16",
                                      "--quantization", "awq"]
    assert config["runtime_env"] == {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}
    mounts = [command[4:6] for command in user_data["bootcmd"] if "cosmicac-mount" in command]
    assert mounts == [["/dev/disk/by-id/virtio-cac-hub-token", "/run/cosmicac/hub-token"]]


def test_the_model_cache_claim_is_a_virtiofs_share_of_every_inference_vmi_only():
    settings = KubevirtSettings(model_cache_claim="model-cache")
    secret, _, vmi = render_replica(vllm_unit(nodes=("gpu-node-1",)), settings,
                                    gpu_resources={"gpu-node-1": H100})
    assert vmi["spec"]["domain"]["devices"]["filesystems"] == [
        {"name": "model-cache", "virtiofs": {}}]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}} \
        in vmi["spec"]["volumes"]
    user_data = yaml.safe_load(base64.b64decode(secret["data"]["userdata"]))
    assert json.loads(user_data["write_files"][0]["content"])["model_cache_dir"] \
        == "/var/cache/cosmicac/models"
    assert any(command[4:7] == ["model-cache", "/var/cache/cosmicac/models", "virtiofs"]
               for command in user_data["bootcmd"])
    # A container job's VMI gets neither the share nor the token (no model server).
    _, _, container = render_replica(container_unit(), settings,
                                     gpu_resources={"gpu-node-1": H100})
    assert "filesystems" not in container["spec"]["domain"]["devices"]
    assert [v["name"] for v in container["spec"]["volumes"]] == ["root", "cloudinit"]
