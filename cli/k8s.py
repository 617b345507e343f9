"""``cosmicac k8s render``: the objects a job would become, for operators to review
(and ``cosmicac k8s overlay``: the overlay's network attachment, to apply once).

Runs the real placement (:mod:`nodes.ork.placement`) on the cluster described
in CLUSTER.json, builds each replica as the worker would, and prints every
Secret, DataVolume and VirtualMachineInstance the ``kubevirt`` backend would
apply, as multi-document YAML, in apply order. No cluster is contacted and the
``kubernetes`` client is not imported.

What a live worker supplies and a render cannot know is taken from options,
with generated defaults: the worker's key (also the rack's key; default: a
fresh random key pair), each replica's report token (default: random), the
job id (default: ``j-`` + 16 random hex), bootstrap nodes, relays, authorized
keys. The rendered Secrets therefore hold *those* values, not a live
worker's.

CLUSTER.json::

    {"location": "default",
     "overlay_network": true,                 # optional, default true
     "nodes": [{"name": "gpu-node-1", "gpus": 8,
                "gpu_resource": "nvidia.com/GH100_H100_SXM5_80GB",
                "infiniband": true,           # optional, default true
                "schedulable": true}]}        # optional, default true
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any

import typer
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contracts.model import JobSpec, NodeInfo, RackReport
from nodes.k8s_worker.kubevirt.render import render_replica, replica_unit
from nodes.k8s_worker.kubevirt.settings import KubevirtSettings
from nodes.ork.capacity import Capacity
from nodes.ork.placement import PlacementError, place
from p2p.keys import KeyPair

from ._console import err, fail

__all__ = ["ClusterFile", "ClusterNode", "app"]

app = typer.Typer(help="Kubernetes (KubeVirt/CDI) helpers for operators.", no_args_is_help=True)

#: Used when neither --settings nor an option names them, so that a multi-node
#: vLLM replica can be rendered; a note on stderr says so.
DEFAULT_OVERLAY_NETWORK = "cosmicac-overlay"
DEFAULT_INFINIBAND_RESOURCE = "nvidia.com/infiniband_hca"


class ClusterNode(BaseModel):
    """One node of CLUSTER.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=253)
    gpus: int = Field(ge=0, le=1024)
    gpu_resource: str | None = None
    infiniband: bool | None = None
    schedulable: bool = True


class ClusterFile(BaseModel):
    """CLUSTER.json: a rack as a worker would report it, and where it is listed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    location: str = Field(default="default", min_length=1, max_length=64)
    overlay_network: bool | None = None
    nodes: tuple[ClusterNode, ...] = Field(min_length=1, max_length=10_000)


def _read(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML
    except OSError as exc:
        fail(f"cannot read {what} {path}: {exc.strerror or exc}")
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        fail(f"{what} {path} is not valid JSON: {' '.join(str(exc).split())}")


def _model(model: type[BaseModel], data: Any, path: Path, what: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or what
        fail(f"{what} {path}: {where}: {first['msg']}")


def _settings(path: Path | None, namespace: str | None, overlay: str | None,
              infiniband: str | None) -> tuple[KubevirtSettings, list[str]]:
    data = {} if path is None else _read(path, "settings")
    base: KubevirtSettings = _model(KubevirtSettings, data or {}, path or Path("-"), "settings")
    update: dict[str, Any] = {}
    notes: list[str] = []
    if namespace is not None:
        update["namespace"] = namespace
    if overlay is not None or base.overlay_network is None:
        update["overlay_network"] = overlay or DEFAULT_OVERLAY_NETWORK
        if overlay is None:
            notes.append(f"overlay network: placeholder {DEFAULT_OVERLAY_NETWORK!r} "
                         "(give --overlay-network or --settings)")
    if infiniband is not None or base.infiniband_resource is None:
        update["infiniband_resource"] = infiniband or DEFAULT_INFINIBAND_RESOURCE
        if infiniband is None:
            notes.append(f"InfiniBand resource: placeholder {DEFAULT_INFINIBAND_RESOURCE!r} "
                         "(give --infiniband-resource or --settings)")
    merged = {**base.model_dump(), **update}
    return _model(KubevirtSettings, merged, path or Path("-"), "settings"), notes


def _rack(cluster: ClusterFile, settings: KubevirtSettings,
          path: Path) -> tuple[RackReport, dict[str, str]]:
    nodes, resources = [], {}
    for node in cluster.nodes:
        resource = node.gpu_resource or settings.gpu_resource
        if resource is None and node.gpus:
            fail(f"cluster {path}: node {node.name} has GPUs but no gpu_resource "
                 "(or give gpu_resource in --settings)")
        if resource is not None:
            resources[node.name] = resource
        ib = node.infiniband if node.infiniband is not None else True
        nodes.append(NodeInfo(name=node.name, gpus=node.gpus, gpu_resource=resource,
                              infiniband=ib, schedulable=node.schedulable))
    overlay = cluster.overlay_network if cluster.overlay_network is not None else True
    try:
        return RackReport(nodes=tuple(nodes), overlay_network=overlay), resources
    except ValidationError as exc:
        fail(f"cluster {path}: {exc.errors()[0]['msg']}")


def _document(manifest: dict[str, Any], replica: int) -> str:
    labels = manifest["metadata"].get("labels", {})
    header = (f"# replica {replica}, node rank {labels.get('cosmicac.io/node-rank', '?')}: "
              f"{manifest['kind']} {manifest['metadata']['name']}")
    return f"---\n{header}\n" + yaml.safe_dump(manifest, sort_keys=False,
                                                default_flow_style=False)


@app.command("render")
def render(
    job_file: Path = typer.Argument(..., metavar="JOB.json",
                                    help="The job, as a user asks for it."),
    cluster_file: Path = typer.Option(..., "--cluster", metavar="CLUSTER.json",
                                      help="The cluster's nodes and GPUs (one rack)."),
    namespace: str | None = typer.Option(None, "--namespace", help="Namespace of the objects."),
    settings_file: Path | None = typer.Option(
        None, "--settings", metavar="SETTINGS.json",
        help="The worker's kubevirt settings (JSON or YAML)."),
    overlay_network: str | None = typer.Option(
        None, "--overlay-network", help="Multus NAD ([ns/]name) for multi-node replicas."),
    infiniband_resource: str | None = typer.Option(
        None, "--infiniband-resource", help="InfiniBand HCA resource for multi-node replicas."),
    job_id: str | None = typer.Option(None, "--job-id", help="Default: j- + 16 random hex."),
    worker: str | None = typer.Option(
        None, "--worker", help="The worker's (and rack's) public key; default: a random one."),
    report_token: str | None = typer.Option(
        None, "--report-token", help="64 hex, for every replica; default: random per replica."),
    bootstrap: list[str] = typer.Option([], "--bootstrap", help="DHT bootstrap host:port."),
    relay: list[str] = typer.Option([], "--relay", help="A relay's public key."),
    authorized_key: list[str] = typer.Option(
        [], "--authorized-key", help="A user key allowed to open shells."),
    worker_address: list[str] = typer.Option([], "--worker-address", help="host:port"),
) -> None:
    """Place JOB.json on CLUSTER.json and print every object it would apply, as YAML.

    Exits 1 with the reason when the job cannot be placed or an input is invalid.

    Example: cosmicac k8s render job.json --cluster cluster.json --namespace cosmicac
    """
    spec: JobSpec = _model(JobSpec, _read(job_file, "job"), job_file, "job")
    settings, notes = _settings(settings_file, namespace, overlay_network, infiniband_resource)
    cluster_doc: ClusterFile = _model(ClusterFile, _read(cluster_file, "cluster"),
                                      cluster_file, "cluster")
    rack, resources = _rack(cluster_doc, settings, cluster_file)
    worker_key = worker or KeyPair.generate().hex
    capacity = Capacity()
    try:
        capacity.set_rack(worker_key, cluster_doc.location, rack)
        placements = place(capacity, spec)
    except PlacementError as exc:
        fail(f"cannot place job {spec.name!r}: {exc}")
    job = job_id or f"j-{secrets.token_hex(8)}"
    documents = []
    try:
        for index, placement in enumerate(placements):
            agent = {"worker": worker_key, "report_token": report_token or secrets.token_hex(32),
                     "bootstrap": tuple(bootstrap), "relays": tuple(relay),
                     "authorized_keys": tuple(authorized_key),
                     "worker_addresses": tuple(worker_address)}
            unit = replica_unit(job, index, spec, placement, agent=agent)
            documents += [_document(m, index)
                          for m in render_replica(unit, settings, gpu_resources=resources)]
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"agent config: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
    except ValueError as exc:
        fail(str(exc))
    if any(p.multi_node for p in placements):
        for note in notes:
            err.print(f"note: {note}")
    sys.stdout.write("".join(documents))
    sys.stdout.flush()



@app.command("overlay")
def overlay(
    settings_file: Path | None = typer.Option(
        None, "--settings", metavar="SETTINGS.json",
        help="The worker's kubevirt settings (JSON or YAML)."),
    namespace: str | None = typer.Option(None, "--namespace", help="The jobs' namespace."),
    overlay_network: str | None = typer.Option(
        None, "--overlay-network", help="The NAD to render ([ns/]name); default: the "
        f"settings' overlay_network, else {DEFAULT_OVERLAY_NETWORK}."),
) -> None:
    """Print the overlay's NetworkAttachmentDefinition (multi-node replicas), as YAML.

    ovs-cni on the settings' overlay_bridge (or the SR-IOV CNI on
    overlay_sriov_resource with overlay_binding sriov), whereabouts IPAM over
    overlay_subnet. Apply it once; cosmicac doctor checks that it exists.

    Example: cosmicac k8s overlay --settings worker-kubevirt.json | kubectl apply -f -
    """
    from nodes.k8s_worker.kubevirt.overlay import OverlayError, render_overlay_nad

    settings, _ = _settings(settings_file, namespace, overlay_network, None)
    try:
        manifest = render_overlay_nad(settings)
    except OverlayError as exc:
        fail(str(exc))
    sys.stdout.write("---\n" + yaml.safe_dump(manifest, sort_keys=False,
                                              default_flow_style=False))
    sys.stdout.flush()
