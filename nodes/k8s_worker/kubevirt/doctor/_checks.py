"""The doctor's judgement: what the API server answered → one :class:`Check` per requirement.

Pure: :func:`judge` takes the answers the probe gathered (:class:`Observed`,
each a :class:`Reading`) and the worker's settings, and returns the checks in
the order they are printed. Nothing here calls the API, so each failing state
is a table row in the tests.

The requirements (``deploy/README.md`` lists them for operators):

- KubeVirt: a ``kubevirt.io/v1`` ``KubeVirt`` CR in phase ``Deployed``; its
  ``status.observedKubeVirtVersion``;
- CDI: a ``cdi.kubevirt.io/v1beta1`` ``CDI`` CR in phase ``Deployed``; its
  ``status.observedVersion``;
- every row of :data:`~..permissions.PERMISSIONS` allowed
  (``SelfSubjectAccessReview``);
- GPUs: some node's allocatable has the configured ``gpu_resource`` (or an
  ``nvidia.com/`` resource the backend would discover), and KubeVirt's
  ``spec.configuration.permittedHostDevices`` lists it (``pciHostDevices`` or
  ``mediatedDevices``, by ``resourceName``), as NVIDIA's GPU Operator
  documents for VM passthrough;
- a storage class for the root disks: the configured ``storage_class``
  exists, or a default class does;
- multi-node replicas: the overlay's NetworkAttachmentDefinition exists; the
  InfiniBand resource is allocatable somewhere, permitted, and the
  ``HostDevices`` feature gate is on (``hostDevices`` need it; reference §1.3);
- the model cache (``model_cache_claim`` set): KubeVirt shares a PVC with a
  VMI through virtiofs only with its feature gate on (``EnableVirtioFsPVC``
  since KubeVirt 1.3, ``ExperimentalVirtiofsSupport`` before); a warning, as
  a release may have made it default.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..backend import node_info
from ..permissions import Permission, Scope, needed
from ..settings import KubevirtSettings

__all__ = ["Check", "Observed", "Reading", "Status", "exit_code", "judge", "permission_namespace"]

#: Where the operator finds the manifests granting :data:`PERMISSIONS`.
RBAC_FILE = "deploy/kubernetes/worker-rbac.yaml"
_DEFAULT_CLASS = ("storageclass.kubernetes.io/is-default-class",
                  "storageclass.beta.kubernetes.io/is-default-class")
#: What the API server says for a resource it does not serve (a CRD not installed).
_NOT_SERVED = "could not find the requested resource"


class Status(enum.Enum):
    """How one check ended."""

    #: The requirement is met.
    OK = "ok"
    #: Jobs will fail until the operator acts (exit status 1).
    FAILED = "failed"
    #: Worth knowing; jobs of some kinds may fail (exit status unchanged).
    WARNING = "warning"

    @property
    def mark(self) -> str:
        return {"ok": "✓", "failed": "✗", "warning": "!"}[self.value]


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    status: Status
    #: What was found.
    detail: str
    #: What the operator should do (set unless the check passed).
    fix: str = ""

    def line(self) -> str:
        """``✓ name: detail``."""
        return f"{self.status.mark} {self.name}: {self.detail}"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail,
                "fix": self.fix}


@dataclass(frozen=True)
class Reading:
    """One API answer: its HTTP status, the objects it carried, or the server's words.

    ``status`` 0 means no HTTP answer at all (refused, timed out).
    """

    status: int
    objects: tuple[dict[str, Any], ...] = ()
    message: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def problem(self) -> str:
        """``HTTP 403 <message>`` (or the transport error) for a failed reading."""
        return self.message if self.status == 0 else f"HTTP {self.status} {self.message}".strip()


@dataclass(frozen=True)
class Observed:
    """What the probe read from the cluster."""

    #: The API server's URL.
    server: str
    #: ``GET /version``: one object (``gitVersion``...).
    version: Reading
    #: ``kubevirts.kubevirt.io`` in every namespace.
    kubevirt: Reading
    #: ``cdis.cdi.kubevirt.io`` (cluster-scoped).
    cdi: Reading
    nodes: Reading
    storage_classes: Reading
    #: The overlay's NetworkAttachmentDefinition; None when none is configured.
    overlay: Reading | None
    #: Each permission and its ``SelfSubjectAccessReview`` (``status`` object).
    access: tuple[tuple[Permission, Reading], ...] = field(default=())


def _dig(obj: Any, *path: str) -> Any:
    """``obj[path0][path1]...``; anything malformed on the way is None."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def overlay_ref(settings: KubevirtSettings) -> tuple[str, str] | None:
    """(namespace, name) of the overlay's NetworkAttachmentDefinition, if configured."""
    if settings.overlay_network is None:
        return None
    namespace, _, name = settings.overlay_network.rpartition("/")
    return namespace or settings.namespace, name


def permission_namespace(permission: Permission, settings: KubevirtSettings) -> str:
    """The namespace a permission is asked about; "" for every namespace."""
    if permission.scope is Scope.NAMESPACE:
        return settings.namespace
    if permission.scope is Scope.OVERLAY:
        ref = overlay_ref(settings)
        return ref[0] if ref is not None else settings.namespace
    return ""


def _unreadable(name: str, what: str, reading: Reading) -> Check:
    """A check whose object could not be read: why, and what to do about it."""
    if reading.status in (401, 403):
        fix = (f"let the worker's identity read {what}: kubectl apply -f {RBAC_FILE} "
               "(or see the permission lines below)")
    elif reading.status == 0:
        fix = "check the network path to the API server and retry"
    else:
        fix = "see the API server's message; retry when the API server is healthy"
    return Check(name, Status.FAILED, f"cannot read {what}: {reading.problem()}", fix)


def _api(observed: Observed) -> Check:
    name = "Kubernetes API"
    if not observed.version.ok:
        return Check(name, Status.FAILED,
                     f"{observed.server} answers but refuses us: {observed.version.problem()}",
                     "check the kubeconfig's user (token or client certificate) and context")
    version = _dig(observed.version.objects[0] if observed.version.objects else {},
                   "gitVersion")
    return Check(name, Status.OK, f"{observed.server} (Kubernetes {version or 'unknown'})")


def _operator(name: str, what: str, reading: Reading, version_field: str,
              install: str) -> Check:
    """KubeVirt or CDI: one CR, phase Deployed, its version."""
    if reading.status == 404 and _NOT_SERVED in reading.message:
        return Check(name, Status.FAILED, f"not installed (the API serves no {what})", install)
    if not reading.ok:
        return _unreadable(name, what, reading)
    if not reading.objects:
        return Check(name, Status.FAILED, f"its operator is there but no {what} object exists",
                     install)
    cr = reading.objects[0]
    where = "/".join(str(part) for part in (_dig(cr, "metadata", "namespace"),
                                            _dig(cr, "metadata", "name")) if part)
    version = _dig(cr, "status", version_field) or "version unknown"
    phase = _dig(cr, "status", "phase") or "no phase yet"
    if phase != "Deployed":
        return Check(name, Status.FAILED, f"{version}, {phase} (not Deployed; {where})",
                     f"wait for the operator to finish, or see: kubectl describe {what} "
                     f"{_dig(cr, 'metadata', 'name') or ''}".rstrip())
    return Check(name, Status.OK, f"{version}, Deployed ({where})")


def _permission(permission: Permission, reading: Reading, settings: KubevirtSettings) -> Check:
    namespace = permission_namespace(permission, settings)
    where = f"in namespace {namespace}" if namespace else "cluster-wide"
    name = f"may {permission.describe()} {where}"
    if not reading.ok:
        return Check(name, Status.FAILED, f"cannot ask (SelfSubjectAccessReview: "
                                          f"{reading.problem()})",
                     "the cluster must let every user create SelfSubjectAccessReviews "
                     "(the default system:basic-user binding)")
    status = reading.objects[0] if reading.objects else {}
    if _dig(status, "allowed") is True:
        return Check(name, Status.OK, f"allowed: {permission.why}")
    reason = _dig(status, "reason") or _dig(status, "evaluationError") or "no rule allows it"
    return Check(name, Status.FAILED, f"denied ({reason}); needed for: {permission.why}",
                 f"kubectl apply -f {RBAC_FILE} (edit its namespaces if yours differ), or "
                 f"grant '{permission.verb}' on '{permission.resource}' to the worker's identity")


def _node_resources(nodes: Iterable[dict[str, Any]],
                    settings: KubevirtSettings) -> dict[str, tuple[str, int]]:
    """node name → (GPU resource, units), for nodes with GPUs, as the backend sees them."""
    found = {}
    for node in nodes:
        try:
            info = node_info(node, settings)
        except (KeyError, TypeError, ValueError):
            continue  # a malformed node is no GPU node
        if info.gpus and info.gpu_resource is not None:
            found[info.name] = (info.gpu_resource, info.gpus)
    return found


def _gpus(observed: Observed, settings: KubevirtSettings) -> tuple[Check, set[str]]:
    name = "GPUs on nodes"
    if not observed.nodes.ok:
        return _unreadable(name, "nodes", observed.nodes), set()
    found = _node_resources(observed.nodes.objects, settings)
    wanted = settings.gpu_resource or "nvidia.com/* (discovered)"
    if not found:
        return Check(name, Status.FAILED, f"no node has allocatable {wanted}",
                     "install a device plugin that offers GPUs to VMs (NVIDIA's GPU Operator "
                     "with sandbox workloads, or kubevirt-gpu-device-plugin) with the GPUs "
                     "bound to vfio-pci; or set gpu_resource to the resource your nodes "
                     "advertise"), set()
    resources = {resource for resource, _ in found.values()}
    total = sum(units for _, units in found.values())
    return Check(name, Status.OK, f"{total} on {len(found)} node(s) "
                                  f"({', '.join(sorted(resources))})"), resources


def _kubevirt_config(observed: Observed) -> dict[str, Any] | None:
    if not observed.kubevirt.ok or not observed.kubevirt.objects:
        return None
    config = _dig(observed.kubevirt.objects[0], "spec", "configuration")
    return config if isinstance(config, dict) else {}


def _permitted(config: dict[str, Any]) -> set[str]:
    """Resource names KubeVirt's ``permittedHostDevices`` lets VMIs use."""
    names = set()
    for kind in ("pciHostDevices", "mediatedDevices"):
        for entry in _dig(config, "permittedHostDevices", kind) or ():
            if isinstance(entry, dict) and isinstance(entry.get("resourceName"), str):
                names.add(entry["resourceName"])
    return names


def _permit_fix(resources: Iterable[str]) -> str:
    entries = "; ".join(f"{{pciVendorSelector: <vendor:device from lspci -nn>, resourceName: "
                        f"{r}, externalResourceProvider: true}}" for r in sorted(resources))
    return ("add to the KubeVirt CR's spec.configuration.permittedHostDevices.pciHostDevices "
            f"(mediatedDevices for vGPUs): {entries}")


def _gpus_permitted(observed: Observed, resources: set[str]) -> Check | None:
    name = "GPUs permitted by KubeVirt"
    if not resources:
        return None  # no GPUs found: the check above failed already
    config = _kubevirt_config(observed)
    if config is None:
        return Check(name, Status.WARNING, "not checked: the KubeVirt CR was not read",
                     "fix the KubeVirt line above, then run the doctor again")
    missing = resources - _permitted(config)
    if missing:
        return Check(name, Status.FAILED,
                     f"{', '.join(sorted(missing))} not in permittedHostDevices",
                     _permit_fix(missing))
    return Check(name, Status.OK, f"{', '.join(sorted(resources))} in permittedHostDevices")


def _storage(observed: Observed, settings: KubevirtSettings) -> Check:
    name = "storage class for root disks"
    if not observed.storage_classes.ok:
        return _unreadable(name, "storageclasses.storage.k8s.io", observed.storage_classes)
    classes = {str(_dig(c, "metadata", "name")): c for c in observed.storage_classes.objects}
    if settings.storage_class is not None:
        chosen = classes.get(settings.storage_class)
        if chosen is None:
            known = ", ".join(sorted(classes)) or "none"
            return Check(name, Status.FAILED,
                         f"storage_class {settings.storage_class!r} does not exist "
                         f"(classes: {known})",
                         "set kubevirt.storage_class to an existing class, or create it")
        how = "configured"
    else:
        defaults = sorted(n for n, c in classes.items()
                          if any(_dig(c, "metadata", "annotations", a) == "true"
                                 for a in _DEFAULT_CLASS))
        if not defaults:
            return Check(name, Status.FAILED,
                         "storage_class is not set and the cluster has no default class",
                         "set kubevirt.storage_class, or mark a class default: kubectl "
                         "annotate storageclass NAME "
                         "storageclass.kubernetes.io/is-default-class=true")
        chosen, how = classes[defaults[0]], "the cluster's default"
    detail = f"{_dig(chosen, 'metadata', 'name')} ({how}, {_dig(chosen, 'provisioner')})"
    if _dig(chosen, "volumeBindingMode") == "WaitForFirstConsumer":
        detail += "; binds on first consumer: each import starts once its VMI exists"
    return Check(name, Status.OK, detail)


def _overlay(observed: Observed, settings: KubevirtSettings) -> Check:
    name = "overlay network (multi-node replicas)"
    ref = overlay_ref(settings)
    if ref is None or observed.overlay is None:
        return Check(name, Status.WARNING,
                     "overlay_network is not set: multi-node vLLM replicas cannot be placed",
                     "set kubevirt.overlay_network to a NetworkAttachmentDefinition "
                     "([namespace/]name) if you serve models across nodes")
    namespace, nad = ref
    reading = observed.overlay
    if reading.status == 404 and _NOT_SERVED in reading.message:
        return Check(name, Status.FAILED,
                     "Multus is not installed (the API serves no network-attachment-"
                     "definitions.k8s.cni.cncf.io)",
                     "install Multus, then create the overlay's NetworkAttachmentDefinition")
    if reading.status == 404:
        return Check(name, Status.FAILED,
                     f"NetworkAttachmentDefinition {namespace}/{nad} does not exist",
                     f"create it in namespace {namespace} (its CNI config: an ovs-cni bridge "
                     "on the VXLAN overlay, or an SR-IOV network), or fix overlay_network")
    if not reading.ok:
        return _unreadable(name, f"NetworkAttachmentDefinition {namespace}/{nad}", reading)
    try:
        cni = json.loads(_dig(reading.objects[0], "spec", "config") or "{}").get("type")
    except (ValueError, AttributeError):
        cni = None
    return Check(name, Status.OK,
                 f"{namespace}/{nad} exists (CNI {cni or 'type not given'}, "
                 f"binding {settings.overlay_binding})")


def _infiniband(observed: Observed, settings: KubevirtSettings) -> list[Check]:
    name = "InfiniBand on nodes"
    resource = settings.infiniband_resource
    if resource is None:
        if settings.overlay_network is None:
            return []
        return [Check(name, Status.WARNING,
                      "infiniband_resource is not set: multi-node replicas get no HCA and "
                      "NCCL falls back to the overlay's TCP",
                      "set kubevirt.infiniband_resource to your HCA's device plugin resource")]
    if not observed.nodes.ok:
        return [_unreadable(name, "nodes", observed.nodes)]
    with_ib = sorted(str(_dig(n, "metadata", "name")) for n in observed.nodes.objects
                     if str(_dig(n, "status", "allocatable", resource) or "0").isdigit()
                     and int(str(_dig(n, "status", "allocatable", resource) or "0")) > 0)
    checks = [Check(name, Status.OK, f"{resource} on {', '.join(with_ib)}") if with_ib else
              Check(name, Status.FAILED, f"no node has allocatable {resource}",
                    "install the HCA's device plugin (SR-IOV or KubeVirt's own via "
                    "permittedHostDevices), or fix infiniband_resource")]
    config = _kubevirt_config(observed)
    permitted = "InfiniBand permitted by KubeVirt"
    if config is None:
        return [*checks, Check(permitted, Status.WARNING,
                               "not checked: the KubeVirt CR was not read",
                               "fix the KubeVirt line above, then run the doctor again")]
    gates = _dig(config, "developerConfiguration", "featureGates") or ()
    if resource not in _permitted(config):
        checks.append(Check(permitted, Status.FAILED,
                            f"{resource} not in permittedHostDevices", _permit_fix([resource])))
    elif "HostDevices" not in gates:
        checks.append(Check(permitted, Status.FAILED,
                            "the HostDevices feature gate is off (hostDevices need it)",
                            "add HostDevices to the KubeVirt CR's spec.configuration."
                            "developerConfiguration.featureGates"))
    else:
        checks.append(Check(permitted, Status.OK,
                            f"{resource} in permittedHostDevices, HostDevices gate on"))
    return checks


#: KubeVirt's feature gates that let a VMI mount a PVC through virtiofs.
_VIRTIOFS_GATES = ("EnableVirtioFsPVC", "ExperimentalVirtiofsSupport")


def _model_cache(observed: Observed, settings: KubevirtSettings) -> list[Check]:
    claim = settings.model_cache_claim
    if claim is None:
        return []
    name = "model cache share (virtiofs)"
    config = _kubevirt_config(observed)
    if config is None:
        return [Check(name, Status.WARNING, "not checked: the KubeVirt CR was not read",
                      "fix the KubeVirt line above, then run the doctor again")]
    gates = _dig(config, "developerConfiguration", "featureGates") or ()
    on = [gate for gate in _VIRTIOFS_GATES if gate in gates]
    if not on:
        return [Check(name, Status.WARNING,
                      f"model_cache_claim {claim!r} is shared by virtiofs, and neither "
                      f"{' nor '.join(_VIRTIOFS_GATES)} is among KubeVirt's feature gates",
                      "add EnableVirtioFsPVC (KubeVirt 1.3 and later; "
                      "ExperimentalVirtiofsSupport before) to the KubeVirt CR's "
                      "spec.configuration.developerConfiguration.featureGates, and make the "
                      f"claim {claim} ReadWriteMany")]
    return [Check(name, Status.OK, f"{claim} through virtiofs ({on[0]} gate on)")]


def judge(observed: Observed, settings: KubevirtSettings) -> list[Check]:
    """Every check, in report order."""
    checks = [
        _api(observed),
        _operator("KubeVirt", "kubevirts.kubevirt.io", observed.kubevirt,
                  "observedKubeVirtVersion",
                  "install KubeVirt: its operator and a KubeVirt CR "
                  "(kubevirt.io/user-guide: cluster_admin/installation)"),
        _operator("CDI", "cdis.cdi.kubevirt.io", observed.cdi, "observedVersion",
                  "install CDI: its operator and a CDI CR (kubevirt/containerized-data-importer "
                  "releases: cdi-operator.yaml, cdi-cr.yaml)"),
    ]
    checks += [_permission(p, r, settings) for p, r in observed.access]
    gpus, resources = _gpus(observed, settings)
    checks.append(gpus)
    if (permitted := _gpus_permitted(observed, resources)) is not None:
        checks.append(permitted)
    checks.append(_storage(observed, settings))
    checks.append(_overlay(observed, settings))
    checks += _infiniband(observed, settings)
    checks += _model_cache(observed, settings)
    return checks


def exit_code(checks: Iterable[Check]) -> int:
    """0 when nothing failed (warnings allowed), else 1."""
    return 1 if any(c.status is Status.FAILED for c in checks) else 0


def permissions_to_ask(settings: KubevirtSettings) -> tuple[Permission, ...]:
    """The rows the doctor asks about for these settings."""
    return needed(overlay=settings.overlay_network is not None)
