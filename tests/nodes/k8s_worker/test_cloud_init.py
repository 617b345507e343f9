"""The user data of every job type is a cloud-config that cloud-init itself accepts.

Validated by Debian's cloud-init (its own schema, strict), in one process of the
system Python that cloud-init is installed for: the same code that reads the
seed in the guest image (deploy/image builds it from Debian's package too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from contracts.model import JobSpec, NodeShare, ReplicaPlacement
from nodes.k8s_worker.backend import ReplicaUnit, replica_unit
from nodes.k8s_worker.cloud_init import (
    cloud_init_meta_data,
    cloud_init_user_data,
    hub_token_mount,
    model_cache_mount,
)

from .units import IMAGE, MODEL_SETTINGS, RACK, TOKEN, WORKER, container_unit, vllm_unit

CLOUD_INIT = shutil.which("cloud-init")
if CLOUD_INIT is None and os.environ.get("CAC_CLOUD_INIT_REQUIRED"):
    raise RuntimeError("CAC_CLOUD_INIT_REQUIRED is set but cloud-init is not installed "
                       "(bash .ci/run deps installs it)")
needs_cloud_init = pytest.mark.skipif(CLOUD_INIT is None,
                                      reason="cloud-init is not installed (bash .ci/run deps)")

#: Validates each user data given (a JSON list on stdin) and prints, per document,
#: "" or cloud-init's error. Runs under the interpreter of cloud-init's script.
_VALIDATE = """
import json, sys, yaml
from cloudinit.config.schema import get_schema, validate_cloudconfig_schema
schema = get_schema()
out = []
for text in json.load(sys.stdin):
    try:
        validate_cloudconfig_schema(yaml.safe_load(text), schema=schema, strict=True,
                                    log_details=False)
        out.append("")
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


def _cloud_init_python() -> str:
    """The interpreter named on cloud-init's #! line (Debian's python3)."""
    assert CLOUD_INIT is not None
    with open(CLOUD_INIT, "rb") as script:
        line = script.readline().decode().strip()
    assert line.startswith("#!"), line
    return line[2:].split()[0]


def validate(documents: list[str]) -> list[str]:
    result = subprocess.run([_cloud_init_python(), "-c", _VALIDATE],
                            input=json.dumps(documents), capture_output=True, text=True,
                            timeout=60, check=True)
    return json.loads(result.stdout)


def _inference_unit(runtime: str, model: str) -> ReplicaUnit:
    spec = JobSpec(name="speech", team="t1", type="inference", image=IMAGE, gpus=1,
                   runtime=runtime, model=model)
    placement = ReplicaPlacement(rack=RACK, shares=(NodeShare(node="gpu-node-1", gpus=1),))
    return replica_unit("j-99aa88bb77cc66dd", 0, spec, placement,
                        agent={"worker": WORKER, "report_token": TOKEN,
                               "worker_addresses": ("10.0.2.2:49750",),
                               "relays": ("12" * 32,),
                               "relay_addresses": {"12" * 32: ("10.0.2.2:49737",)}})


UNITS = {
    "container": container_unit(),
    "vllm, two nodes": vllm_unit(),
    "parakeet": _inference_unit("parakeet", "nvidia/parakeet-tdt-0.6b-v2"),
    "local": _inference_unit("local", "demo"),
}
#: deploy/image's cloud.cfg.d part (the image's own config; a part has no header).
IMAGE_PART = (Path(__file__).resolve().parents[3] / "deploy" / "image" / "files" / "etc"
              / "cloud" / "cloud.cfg.d" / "90-cosmicac.cfg")


def _documents() -> dict[str, str]:
    """Every document the tests below judge, by name: one cloud-init process for all
    (each start of it costs about half a second of CPU)."""
    documents = {f"{kind}, rank {vmi.node_rank}": cloud_init_user_data(vmi.agent)
                 for kind, unit in UNITS.items() for vmi in unit.vmis}
    settled = vllm_unit(nodes=("gpu-node-1",), model_settings=MODEL_SETTINGS,
                        runtime_settings={"args": ["--quantization", "awq"]})
    documents["vllm with a hub token and the model cache, rank 0"] = cloud_init_user_data(
        settled.vmis[0].agent, mounts=[hub_token_mount(), model_cache_mount()])
    good = documents["container, rank 0"]
    documents["broken: runcmd a number"] = good.replace("runcmd:", "runcmd: 3\nunused:", 1)
    documents["broken: bootcmd a string"] = "#cloud-config\nbootcmd: not-a-list\n"
    documents["image"] = "#cloud-config\n" + IMAGE_PART.read_text()
    return documents


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str]:
    documents = _documents()
    return dict(zip(documents, validate(list(documents.values())), strict=True))


@needs_cloud_init
def test_every_job_types_user_data_passes_cloud_inits_own_schema(verdicts):
    user_data = {name: verdict for name, verdict in verdicts.items() if "rank" in name}
    assert len(user_data) == 6
    assert user_data == dict.fromkeys(user_data, "")


@needs_cloud_init
def test_the_validator_rejects_what_cloud_init_would_reject(verdicts):
    """The check above can fail: a document cloud-init refuses is reported."""
    broken = [verdict for name, verdict in verdicts.items() if name.startswith("broken")]
    assert len(broken) == 2
    assert all("SchemaValidationError" in verdict for verdict in broken), broken


@needs_cloud_init
def test_the_guest_images_own_cloud_config_passes_the_schema(verdicts):
    assert verdicts["image"] == ""
    assert yaml.safe_load(IMAGE_PART.read_text())["datasource_list"] == ["NoCloud", "None"]


def test_meta_data_names_the_instance_and_host_whatever_the_name():
    for name in ("cac-00112233aabbccdd-r0-n0", "odd: name # with 'quotes'\n"):
        document = yaml.safe_load(cloud_init_meta_data(name, name))
        assert document == {"instance-id": name, "local-hostname": name}


def test_the_mounts_run_on_every_boot_before_the_agent_starts():
    document = yaml.safe_load(cloud_init_user_data(
        container_unit().vmis[0].agent, mounts=[hub_token_mount(), model_cache_mount()]))
    token, cache, start = document["bootcmd"]
    assert token[:4] == ["sh", "-c", token[2], "cosmicac-mount"]
    assert token[4:] == ["/dev/disk/by-id/virtio-cac-hub-token", "/run/cosmicac/hub-token",
                         "auto", "ro,nodev,nosuid,noexec", "0700"]
    assert cache[4:7] == ["model-cache", "/var/cache/cosmicac/models", "virtiofs"]
    assert "cosmicac-boot" in start  # the agent's start comes after both


def test_the_mount_script_mounts_once_and_survives_a_missing_disk(tmp_path):
    """The script as the guest's shell runs it, with mount and friends faked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name, body in {"udevadm": "exit 0",
                       "mountpoint": f'test -e "{tmp_path}/mounted" && exit 0; exit 1',
                       "mount": f'echo "mount $*" >> {calls}; '
                                f'test -e "$5" || exit 32; touch {tmp_path}/mounted'}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    target = tmp_path / "run" / "hub-token"
    disk = tmp_path / "disk"
    command = yaml.safe_load(cloud_init_user_data(
        container_unit().vmis[0].agent,
        mounts=[hub_token_mount()]))["bootcmd"][0]
    command[4:6] = [str(disk), str(target)]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    missing = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert missing.returncode == 0  # the boot goes on; the agent reports the token missing
    assert f"cannot mount {disk}" in missing.stderr
    assert oct(target.stat().st_mode & 0o777) == "0o700"
    disk.touch()
    for _ in range(2):  # mounted on the first run, left alone on the second
        subprocess.run(command, env=env, check=True, timeout=30)
    assert calls.read_text().count("mount -t auto -o ro,nodev,nosuid,noexec") == 2
