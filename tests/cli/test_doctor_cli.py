"""``cosmicac doctor``: its lines and exit statuses, against the Kubernetes API double.

In this process through :func:`tests.cli.support.cosmicac` (the command runs its
own trio loop in a worker thread), and once as a real process, as an operator
runs it. The checks themselves are tested in tests/nodes/k8s_worker/test_doctor.py.
"""

from __future__ import annotations

import json

import pytest
import trio

from tests.nodes.k8s_worker import test_kubevirt_backend as flows
from tests.nodes.k8s_worker.doctor_cluster import (
    closed_port,
    ready_cluster,
    serve,
    settings_file,
)

from .support import cosmicac, cosmicac_process, one_error_line

pytestmark = pytest.mark.slow

double = flows.double
LIMIT_S = 30


@pytest.fixture
def ready(double, tmp_path):
    """(kubeconfig, settings) of a ready cluster in the double."""
    serve(double, ready_cluster())
    return (str(double.kubeconfig(tmp_path / "kubeconfig")),
            str(settings_file(tmp_path / "settings.json")))


async def test_a_ready_cluster_exits_0_as_a_real_process(ready):
    kubeconfig, settings = ready
    with trio.fail_after(LIMIT_S):
        done = await cosmicac_process("doctor", "--kubeconfig", kubeconfig, "--settings",
                                      settings)
    lines = done.stdout.decode().splitlines()
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert lines[0].startswith("✓ Kubernetes API: http://127.0.0.1:")
    assert all(line.startswith("✓ ") for line in lines), lines


async def test_a_failed_check_exits_1_and_says_what_to_do(ready, double):
    kubeconfig, settings = ready
    double.allowed = {("", "nodes", "list")}  # every other permission is denied
    with trio.fail_after(LIMIT_S):
        ran = await cosmicac("doctor", "--kubeconfig", kubeconfig, "--settings", settings)
    out = ran.stdout.decode()
    assert ran.returncode == 1, out
    assert "✓ may list nodes cluster-wide: allowed" in out
    assert "✗ may create secrets in namespace cosmicac: denied" in out
    assert "    what to do: kubectl apply -f deploy/kubernetes/worker-rbac.yaml" in out


async def test_options_override_the_settings_and_json_is_one_document(ready):
    kubeconfig, settings = ready
    with trio.fail_after(LIMIT_S):
        ran = await cosmicac("doctor", "--kubeconfig", kubeconfig, "--settings", settings,
                             "--storage-class", "fast-nvme", "-o", "json")
    report = json.loads(ran.stdout)
    assert ran.returncode == report["exit_code"] == 1
    failed = [c for c in report["checks"] if c["status"] == "failed"]
    assert [c["name"] for c in failed] == ["storage class for root disks"]
    assert "fast-nvme" in failed[0]["detail"] and failed[0]["fix"]



async def test_an_unreachable_api_server_exits_3(double, tmp_path):
    double.url = f"http://127.0.0.1:{closed_port()}"
    kubeconfig = str(double.kubeconfig(tmp_path / "kubeconfig"))
    with trio.fail_after(LIMIT_S):
        ran = await cosmicac("doctor", "--kubeconfig", kubeconfig)
    assert ran.returncode == 3
    assert ran.stdout.decode().startswith(f"✗ Kubernetes API: the Kubernetes API at "
                                          f"{double.url} cannot be reached")


@pytest.mark.parametrize("args, words", [
    (["--kubeconfig", "{tmp}/absent"], "no Kubernetes configuration"),
    (["--namespace", "Not_A_Label"], "settings -: namespace"),
    (["--settings", "{tmp}/bad.json"], "settings"),
    (["--timeout", "0"], "must be a number of seconds"),
])
async def test_a_usage_or_settings_error_exits_2(tmp_path, args, words):
    (tmp_path / "bad.json").write_text('{"namespace": 3, "surprise": true}')
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    with trio.fail_after(LIMIT_S):
        ran = await cosmicac("doctor", *args)
    assert ran.returncode == 2, ran
    assert words in ran.stderr.decode()
    if "--timeout" not in args:
        one_error_line(ran)
