"""``cosmicac k8s render``: real placement, manifests valid against the upstream schemas."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app

from .schema_check import validate
from .units import H100, IMAGE

runner = CliRunner()
REPO = Path(__file__).resolve().parents[3]


def _job(**fields):
    job = {"name": "demo", "team": "t1", "type": "container", "image": IMAGE, "gpus": 1,
           "replicas": 1, "runtime": None, "model": None, "location": "default"}
    return {**job, **fields}


def _vllm(**fields):
    return _job(type="inference", runtime="vllm", model="meta-llama/Llama-3.1-70B", **fields)


@pytest.fixture
def files(tmp_path):
    cluster = {"location": "default", "nodes": [
        {"name": f"gpu-node-{i}", "gpus": 8, "gpu_resource": H100} for i in (1, 2)]}
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))

    def render(job, *options):
        (tmp_path / "job.json").write_text(json.dumps(job))
        return runner.invoke(app, ["k8s", "render", str(tmp_path / "job.json"), "--cluster",
                                   str(tmp_path / "cluster.json"), *options])

    return render


def _documents(result):
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.stdout))
    for document in documents:
        validate(document)
    return documents


def _vmis(documents):
    return [d for d in documents if d["kind"] == "VirtualMachineInstance"]


def test_one_node_container_job(files):
    documents = _documents(files(_job(), "--namespace", "gpu-jobs",
                                 "--job-id", "j-0123456789abcdef"))
    assert [d["kind"] for d in documents] == ["Secret", "DataVolume", "VirtualMachineInstance"]
    assert all(d["metadata"]["namespace"] == "gpu-jobs" for d in documents)
    assert documents[2]["metadata"]["name"] == "cac-0123456789abcdef-r0-n0"


def test_two_replica_vllm_job(files):
    documents = _documents(files(_vllm(gpus=8, replicas=2)))
    vmis = _vmis(documents)
    assert len(documents) == 6 and len(vmis) == 2
    assert {v["spec"]["nodeSelector"]["kubernetes.io/hostname"] for v in vmis} == {
        "gpu-node-1", "gpu-node-2"}
    assert all("hostDevices" not in v["spec"]["domain"]["devices"] for v in vmis)
    assert "Service" not in {d["kind"] for d in documents}


def test_sixteen_gpu_vllm_replica_spans_two_eight_gpu_nodes(files):
    result = files(_vllm(gpus=16), "--overlay-network", "cosmicac/vllm-overlay")
    documents = _documents(result)
    vmis = _vmis(documents)
    assert [len(v["spec"]["domain"]["devices"]["gpus"]) for v in vmis] == [8, 8]
    # The headless Service first, so the VMIs' names resolve from their first boot.
    assert documents[0]["kind"] == "Service" and documents[0]["spec"]["clusterIP"] == "None"
    assert {v["spec"]["subdomain"] for v in vmis} == {documents[0]["metadata"]["name"]}
    for vmi in vmis:
        assert vmi["spec"]["networks"][1]["multus"] == {"networkName": "cosmicac/vllm-overlay"}
        assert vmi["spec"]["domain"]["devices"]["hostDevices"][0]["deviceName"]
    assert "placeholder 'nvidia.com/infiniband_hca'" in result.stderr
    assert "overlay network" not in result.stderr  # given as an option


def test_a_container_job_larger_than_any_node_exits_1_with_the_reason(files):
    result = files(_job(gpus=9))
    assert result.exit_code == 1
    assert "cannot place job 'demo'" in result.stderr and "9" in result.stderr
    assert result.stdout == ""
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


def test_an_invalid_job_names_the_field(files):
    result = files(_job(gpus=0))
    assert result.exit_code == 1 and "gpus" in result.stderr
    assert "Traceback" not in result.output


def test_render_imports_no_kubernetes_client(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps(_job()))
    (tmp_path / "cluster.json").write_text(json.dumps(
        {"nodes": [{"name": "n1", "gpus": 8, "gpu_resource": H100}]}))
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from cli.main import app\n"
        f"r = CliRunner().invoke(app, ['k8s', 'render', {str(tmp_path / 'job.json')!r},"
        f" '--cluster', {str(tmp_path / 'cluster.json')!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'kubernetes' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
