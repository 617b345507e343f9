"""The worker's RBAC manifests grant exactly what the backend and the doctor call.

The backend runs its real flows (those of ``test_kubevirt_backend.py``:
capacity, create, watch, restart, delete, failures) against the API double,
and so does the doctor; every request the double received is held against
``deploy/kubernetes/worker-rbac.yaml`` as the API server's authorizer would.
A new call without a new row in ``permissions.py`` (and the file regenerated)
fails here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from nodes.k8s_worker.kubevirt.doctor import run_doctor
from nodes.k8s_worker.kubevirt.permissions import (
    PERMISSIONS,
    SERVICE_ACCOUNT,
    rbac_manifests,
    rbac_yaml,
)

from . import test_kubevirt_backend as flows
from .kube_double import Access
from .rbac_check import grants, ungranted
from .schema_check import _check_model

pytestmark = pytest.mark.slow

MANIFEST = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "worker-rbac.yaml"
ACCOUNT = (flows.NS, SERVICE_ACCOUNT)
#: What Kubernetes' default ClusterRoles give every authenticated identity:
#: ``GET /version`` (system:public-info-viewer) and self reviews (system:basic-user).
DEFAULT_GRANTS = {("", "", "get"), ("authorization.k8s.io", "selfsubjectaccessreviews", "create")}
REGENERATE = (".venv/bin/python -c \"from nodes.k8s_worker.kubevirt.permissions import "
              "rbac_yaml; print(rbac_yaml(), end='')\" > deploy/kubernetes/worker-rbac.yaml")

double = flows.double  # the same cluster (nodes) the backend's own tests run on


def _documents() -> list[dict]:
    return list(yaml.safe_load_all(MANIFEST.read_text()))


def _kinds(documents):
    return [d["kind"] for d in documents]


def test_the_manifest_file_is_what_the_table_renders():
    assert MANIFEST.read_text() == rbac_yaml(), f"regenerate it: {REGENERATE}"


@pytest.mark.parametrize("namespace, overlay", [("cosmicac", "cosmicac"), ("gpu-jobs", None),
                                                ("gpu-jobs", "networks")])
def test_every_manifest_is_valid_strictly_against_the_clients_models(namespace, overlay):
    for document in (_documents() if (namespace, overlay) == ("cosmicac", "cosmicac")
                     else rbac_manifests(namespace, overlay)):
        model = f"V1{document['kind']}"
        _check_model(document, model, document["kind"])  # no undeclared field, right types
        getattr(client, model).from_dict(document)  # required fields present


@pytest.mark.parametrize("path", [("rules", 0), ("roleRef",), ("subjects", 0), ("metadata",)])
def test_an_undeclared_field_in_a_manifest_fails(path):
    kind = "RoleBinding" if path[0] in ("roleRef", "subjects") else "Role"
    document = copy.deepcopy(next(d for d in _documents() if d["kind"] == kind))
    target = document
    for step in path:
        target = target[step]
    target["surprise"] = "x"
    with pytest.raises(AssertionError, match="surprise"):
        _check_model(document, f"V1{kind}", kind)


def test_an_overlay_elsewhere_gets_a_role_there_and_no_overlay_gets_none():
    elsewhere = rbac_manifests("gpu-jobs", "networks")
    overlay_roles = [d for d in elsewhere if d["kind"] == "Role"
                     and d["metadata"]["namespace"] == "networks"]
    assert [r["resources"] for r in overlay_roles[0]["rules"]] == [
        ["network-attachment-definitions"]]
    nad = Access("k8s.cni.cncf.io", "network-attachment-definitions", "get", "networks")
    assert not ungranted(elsewhere, ("gpu-jobs", SERVICE_ACCOUNT), [nad])
    assert ungranted(rbac_manifests("gpu-jobs", None), ("gpu-jobs", SERVICE_ACCOUNT), [nad])


def test_a_verb_or_namespace_the_manifest_lacks_is_found():
    documents = _documents()
    patch = Access("kubevirt.io", "virtualmachineinstances", "patch", flows.NS)
    elsewhere = Access("", "secrets", "create", "default")
    listed = Access("", "secrets", "list", flows.NS)
    fine = Access("", "nodes", "list", "")
    assert ungranted(documents, ACCOUNT, [patch, elsewhere, listed, fine]) == {
        patch, elsewhere, listed}
    assert ungranted(documents, ("default", SERVICE_ACCOUNT), [fine]) == {fine}


async def _backend_accesses(double, nursery) -> list[Access]:
    """Every request of the backend's flows (those of test_kubevirt_backend.py)."""
    await flows.test_capacity_reports_nodes_gpus_infiniband_and_schedulability(double)
    await flows.test_create_watch_restart_delete(double, nursery)
    await flows.test_failures_map_to_events(double, nursery)
    await flows.test_a_multi_node_replica_gets_a_headless_service_kept_on_restart(double)
    await flows.test_an_isolated_job_gets_a_vlan_of_its_own_and_a_gateway_its_members_reach(
        double, nursery)
    return list(double.accesses)


async def test_the_backend_calls_only_what_the_manifest_grants_and_the_table_lists(
        double, nursery):
    accesses = await _backend_accesses(double, nursery)
    assert not ungranted(_documents(), ACCOUNT, accesses)
    used = {(a.group, a.resource, a.verb) for a in accesses}
    # Every flow ran: each verb of the backend's rows was seen, and nothing else.
    assert used == {(p.group, p.resource, p.verb) for p in PERMISSIONS if p.user == "backend"}


async def test_the_manifest_grants_nothing_that_neither_the_backend_nor_the_doctor_uses(
        double, nursery):
    backend = {(a.group, a.resource, a.verb) for a in await _backend_accesses(double, nursery)}
    double.accesses.clear()
    await run_doctor(flows.SETTINGS, api_client_factory=double.api_client)
    doctor_accesses = list(double.accesses)
    assert not ungranted(_documents(), ACCOUNT,
                         [a for a in doctor_accesses
                          if (a.group, a.resource, a.verb) not in DEFAULT_GRANTS])
    doctor = {(a.group, a.resource, a.verb) for a in doctor_accesses} - DEFAULT_GRANTS
    assert grants(_documents(), ACCOUNT) == backend | doctor
    # The doctor asked about every row of the table, each once.
    asked = [(r["group"], r["resource"], r["verb"]) for r in double.reviews]
    assert sorted(asked) == sorted((p.group, p.resource, p.verb) for p in PERMISSIONS)
