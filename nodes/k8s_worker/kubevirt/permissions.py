"""What the worker's Kubernetes identity may do: one table, and the RBAC objects it makes.

The table :data:`PERMISSIONS` lists every (API group, resource, verb) the
``kubevirt`` backend calls (:mod:`.backend`) and every read ``cosmicac doctor``
makes (:mod:`.doctor`), with where it applies and why. Three readers share it:

- :func:`rbac_manifests` / :func:`rbac_yaml` turn it into a ServiceAccount, a
  Role and a ClusterRole and their bindings; ``deploy/kubernetes/worker-rbac.yaml``
  is :func:`rbac_yaml` with the default namespace (a test keeps them equal);
- the doctor asks the API server about each row (``SelfSubjectAccessReview``);
- a test drives the backend against an API double, records every request as
  (group, resource, verb) and checks that the manifests grant exactly what was
  used, so a new call without a new row fails there.

Two things the worker does are not here because every authenticated identity
may do them under Kubernetes' default roles: ``GET /version``
(``system:public-info-viewer``) and creating a ``SelfSubjectAccessReview``
(``system:basic-user``). A cluster that removed those bindings shows it in the
doctor's first lines.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import yaml

__all__ = [
    "PERMISSIONS",
    "SERVICE_ACCOUNT",
    "Permission",
    "Scope",
    "needed",
    "rbac_manifests",
    "rbac_yaml",
]

#: Name of the ServiceAccount, the Roles and the bindings.
SERVICE_ACCOUNT = "cosmicac-worker"
_RBAC = "rbac.authorization.k8s.io"
_LABELS = {"app.kubernetes.io/name": "cosmicac", "app.kubernetes.io/component": "worker"}


class Scope(enum.Enum):
    """Where a permission applies."""

    #: The namespace of the job objects (``KubevirtSettings.namespace``): a Role.
    NAMESPACE = "namespace"
    #: The namespace of the overlay's NetworkAttachmentDefinition: a Role there.
    OVERLAY = "overlay"
    #: Cluster-scoped objects, or a namespaced kind read in every namespace: a ClusterRole.
    CLUSTER = "cluster"


@dataclass(frozen=True)
class Permission:
    """One verb on one resource, as RBAC and ``SelfSubjectAccessReview`` name it."""

    #: API group; ``""`` is the core group.
    group: str
    #: Resource (plural, lower case, as in the URL).
    resource: str
    #: RBAC verb: get, list, watch, create, update, patch, delete.
    verb: str
    scope: Scope
    #: Who calls it: the backend at run time, or only the doctor's checks.
    user: Literal["backend", "doctor"]
    #: Why, for people reading the manifests and the doctor's output.
    why: str

    def describe(self) -> str:
        """``create virtualmachineinstances.kubevirt.io``: how kubectl names it."""
        resource = self.resource if not self.group else f"{self.resource}.{self.group}"
        return f"{self.verb} {resource}"


def _p(group: str, resource: str, verb: str, scope: Scope,
       user: Literal["backend", "doctor"], why: str) -> Permission:
    return Permission(group, resource, verb, scope, user, why)


_NS, _OVERLAY, _CLUSTER = Scope.NAMESPACE, Scope.OVERLAY, Scope.CLUSTER

#: Everything the worker's identity needs, in the order the manifests list it.
PERMISSIONS: tuple[Permission, ...] = (
    _p("", "secrets", "create", _NS, "backend",
       "each VMI's cloud-init user data (its agent config and report token)"),
    _p("", "secrets", "update", _NS, "backend",
       "a restart writes the new generation's agent config"),
    _p("", "secrets", "delete", _NS, "backend", "a job's delete removes it"),
    _p("", "services", "create", _NS, "backend",
       "a multi-node replica's headless Service: DNS names for its VMIs (Ray's head)"),
    _p("", "services", "delete", _NS, "backend",
       "a job's delete removes it (a restart keeps it)"),
    _p("", "services", "get", _NS, "backend",
       "an isolated job's WireGuard gateway: the port or address members dial"),
    _p("", "pods", "create", _NS, "backend", "an isolated job's WireGuard gateway"),
    _p("", "pods", "delete", _NS, "backend", "a job's delete removes its gateway"),
    _p("k8s.cni.cncf.io", "network-attachment-definitions", "create", _NS, "backend",
       "an isolated job's own network (a VLAN on the overlay's bridge)"),
    _p("k8s.cni.cncf.io", "network-attachment-definitions", "delete", _NS, "backend",
       "a job's delete removes its network"),
    _p("k8s.cni.cncf.io", "network-attachment-definitions", "list", _NS, "backend",
       "the VLANs isolated jobs have taken"),
    _p("cdi.kubevirt.io", "datavolumes", "create", _NS, "backend",
       "each VMI's root disk, imported from the job's image"),
    _p("cdi.kubevirt.io", "datavolumes", "delete", _NS, "backend",
       "a job's delete removes it (a restart keeps it)"),
    _p("cdi.kubevirt.io", "datavolumes", "watch", _NS, "backend",
       "import progress and failures, in the job's System log"),
    _p("kubevirt.io", "virtualmachineinstances", "create", _NS, "backend", "the job's VMs"),
    _p("kubevirt.io", "virtualmachineinstances", "get", _NS, "backend",
       "a restart waits until the old VMI is gone"),
    _p("kubevirt.io", "virtualmachineinstances", "delete", _NS, "backend",
       "restart and delete"),
    _p("kubevirt.io", "virtualmachineinstances", "watch", _NS, "backend",
       "VMI phases become job statuses"),
    _p("k8s.cni.cncf.io", "network-attachment-definitions", "get", _OVERLAY, "doctor",
       "the overlay network of multi-node replicas exists"),
    _p("", "nodes", "list", _CLUSTER, "backend",
       "the rack: GPUs, InfiniBand and schedulable nodes"),
    _p("kubevirt.io", "kubevirts", "list", _CLUSTER, "doctor",
       "KubeVirt's version, permitted host devices and feature gates"),
    _p("cdi.kubevirt.io", "cdis", "list", _CLUSTER, "doctor", "CDI's version"),
    _p("storage.k8s.io", "storageclasses", "list", _CLUSTER, "doctor",
       "a storage class for the root disks"),
)


def needed(overlay: bool) -> tuple[Permission, ...]:
    """The rows that apply: the overlay's row only when an overlay is configured."""
    return tuple(p for p in PERMISSIONS if overlay or p.scope is not Scope.OVERLAY)


def _rules(permissions: Iterable[Permission]) -> list[dict[str, Any]]:
    """One PolicyRule per (group, resource), its verbs in table order."""
    rules: dict[tuple[str, str], list[str]] = {}
    for permission in permissions:
        rules.setdefault((permission.group, permission.resource), []).append(permission.verb)
    return [{"apiGroups": [group], "resources": [resource], "verbs": verbs}
            for (group, resource), verbs in rules.items()]


def _meta(name: str, namespace: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = dict(_LABELS)
    return meta


def _binding(kind: str, name: str, namespace: str | None, sa_namespace: str) -> dict[str, Any]:
    role_kind = "Role" if kind == "RoleBinding" else "ClusterRole"
    return {"apiVersion": f"{_RBAC}/v1", "kind": kind, "metadata": _meta(name, namespace),
            "roleRef": {"apiGroup": _RBAC, "kind": role_kind, "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                          "namespace": sa_namespace}]}


def rbac_manifests(namespace: str = "cosmicac",
                   overlay_namespace: str | None = "cosmicac") -> list[dict[str, Any]]:
    """The worker's Namespace, ServiceAccount, Roles, ClusterRole and bindings.

    Args:
        namespace: where the job objects (and the ServiceAccount) live.
        overlay_namespace: the namespace of the overlay's
            NetworkAttachmentDefinition, or None when no overlay is configured
            (then nothing grants reading it).

    Returns:
        The objects in apply order: the Namespace first, then the
        ServiceAccount, each role before its binding.
    """
    scoped = {scope: [p for p in PERMISSIONS if p.scope is scope] for scope in Scope}
    in_namespace = list(scoped[Scope.NAMESPACE])
    overlay_elsewhere = overlay_namespace is not None and overlay_namespace != namespace
    if overlay_namespace == namespace:
        in_namespace += scoped[Scope.OVERLAY]
    documents: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(namespace, None)},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": _meta(SERVICE_ACCOUNT, namespace)},
        {"apiVersion": f"{_RBAC}/v1", "kind": "Role",
         "metadata": _meta(SERVICE_ACCOUNT, namespace), "rules": _rules(in_namespace)},
        _binding("RoleBinding", SERVICE_ACCOUNT, namespace, namespace),
    ]
    if overlay_elsewhere:
        overlay_role = f"{SERVICE_ACCOUNT}-overlay"
        documents += [
            {"apiVersion": f"{_RBAC}/v1", "kind": "Role",
             "metadata": _meta(overlay_role, overlay_namespace),
             "rules": _rules(scoped[Scope.OVERLAY])},
            _binding("RoleBinding", overlay_role, overlay_namespace, namespace),
        ]
    documents += [
        {"apiVersion": f"{_RBAC}/v1", "kind": "ClusterRole",
         "metadata": _meta(SERVICE_ACCOUNT, None), "rules": _rules(scoped[Scope.CLUSTER])},
        _binding("ClusterRoleBinding", SERVICE_ACCOUNT, None, namespace),
    ]
    return documents


def _why(rule: dict[str, Any]) -> list[str]:
    group, resource = rule["apiGroups"][0], rule["resources"][0]
    return [f"# {p.verb}: {p.why}{' (cosmicac doctor)' if p.user == 'doctor' else ''}"
            for p in PERMISSIONS if (p.group, p.resource) == (group, resource)]


def _dump(document: dict[str, Any]) -> str:
    """One document as YAML, each rule preceded by why each of its verbs is granted."""
    body = {k: v for k, v in document.items() if k != "rules"}
    text = yaml.safe_dump(body, sort_keys=False, default_flow_style=False)
    if "rules" not in document:
        return text
    text += "rules:\n"
    for rule in document["rules"]:
        text += "".join(f"{line}\n" for line in _why(rule))
        text += yaml.safe_dump([rule], sort_keys=False, default_flow_style=False)
    return text


def rbac_yaml(namespace: str = "cosmicac", overlay_namespace: str | None = "cosmicac") -> str:
    """:func:`rbac_manifests` as one multi-document YAML file, commented."""
    header = ("# The wrk-server-k8s-nvidia worker's identity and exactly what it may do.\n"
              "# Generated from nodes/k8s_worker/kubevirt/permissions.py (a test keeps this\n"
              f"# file equal to it): namespace {namespace!r}, the overlay's network attachment\n"
              f"# definition read in {overlay_namespace!r}. Apply: kubectl apply -f <this file>\n")
    return header + "".join(f"---\n{_dump(d)}"
                            for d in rbac_manifests(namespace, overlay_namespace))
