"""``cosmicac doctor``: check a cluster before the first job fails on it.

Reads the worker's kubevirt settings (``--settings``: the same file as
``cosmicac k8s render`` takes, or a worker config whose ``kubevirt`` section
is used), lets options override them, and runs the checks of
:mod:`nodes.k8s_worker.kubevirt.doctor` against the cluster the kubeconfig
names. One line per check; a failed one is followed by what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from ._args import seconds_option
from ._console import OutputFormat, fail, out, print_json, run_trio

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "doctor"]

#: Every check passed (lines marked ``!`` are advice).
EXIT_OK = 0
#: At least one check failed.
EXIT_FAILED = 1
#: A bad option or settings file, or no usable kubeconfig.
EXIT_USAGE = 2
#: The API server could not be reached.
EXIT_UNREACHABLE = 3

_STYLES = {"ok": "green", "failed": "bold red", "warning": "yellow"}


def _settings(path: Path | None, overrides: dict[str, Any]) -> Any:
    """The kubevirt settings from ``path`` (or defaults) with ``overrides`` applied."""
    from nodes.k8s_worker.kubevirt.settings import KubevirtSettings

    from .k8s import _model, _read  # the same reading (and errors) as `k8s render`

    try:
        data = {} if path is None else (_read(path, "settings") or {})
        if isinstance(data, dict) and isinstance(data.get("kubevirt"), dict):
            data = data["kubevirt"]  # a worker's config: its kubevirt section
        if not isinstance(data, dict):
            fail(f"settings {path}: expected a mapping of kubevirt settings")
        merged = {**data, **{k: v for k, v in overrides.items() if v is not None}}
        return _model(KubevirtSettings, merged, path or Path("-"), "settings")
    except typer.Exit:
        raise typer.Exit(EXIT_USAGE) from None  # said why already; a usage error


def _show(checks: list[Any]) -> None:
    for check in checks:
        out.print(Text.assemble((check.status.mark, _STYLES[check.status.value]),
                                f" {check.name}: {check.detail}"))
        if check.fix:
            out.print(Text(f"    what to do: {check.fix}"))


def doctor(
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", dir_okay=False,
        help="The worker's kubeconfig (default: the settings', else $KUBECONFIG or "
             "~/.kube/config)."),
    context: str | None = typer.Option(None, "--context", help="Its context."),
    in_cluster: bool = typer.Option(
        False, "--in-cluster", help="Use the pod's service account instead."),
    namespace: str | None = typer.Option(None, "--namespace", help="The jobs' namespace."),
    settings_file: Path | None = typer.Option(
        None, "--settings", metavar="SETTINGS", dir_okay=False,
        help="The worker's kubevirt settings (JSON or YAML), or a worker config JSON "
             "whose 'kubevirt' section is read."),
    gpu_resource: str | None = typer.Option(None, "--gpu-resource",
                                            help="GPU resource (default: discovered)."),
    storage_class: str | None = typer.Option(None, "--storage-class",
                                             help="Storage class of the root disks."),
    overlay_network: str | None = typer.Option(
        None, "--overlay-network",
        help="Multus NAD of multi-node replicas: name or namespace/name."),
    infiniband_resource: str | None = typer.Option(
        None, "--infiniband-resource", help="InfiniBand HCA resource of multi-node replicas."),
    timeout: float = seconds_option(60.0, "--timeout", maximum=3600.0,
                                    help="Bound of the whole run, in seconds."),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o"),
) -> None:
    """Check that the cluster can run the kubevirt backend's jobs, one line per check.

    Checks: the API server and its version; KubeVirt and CDI installed (and
    their versions); each permission the worker needs (SelfSubjectAccessReview,
    the table of deploy/kubernetes/worker-rbac.yaml); GPUs allocatable on nodes
    and permitted by KubeVirt; a storage class for the root disks; the overlay
    network and InfiniBand of multi-node replicas.

    Exit status: 0 every check passed (lines marked ! are advice), 1 a check
    failed, 2 a usage or settings error, 3 the API server could not be reached.

    Example: cosmicac doctor --namespace cosmicac

    Example: cosmicac doctor --in-cluster -o json
    """
    overrides = {"kubeconfig": str(kubeconfig) if kubeconfig is not None else None,
                 "context": context, "namespace": namespace, "gpu_resource": gpu_resource,
                 "storage_class": storage_class, "overlay_network": overlay_network,
                 "infiniband_resource": infiniband_resource,
                 "in_cluster": True if in_cluster else None}
    settings = _settings(settings_file, overrides)
    from nodes.k8s_worker.kubevirt.doctor import (
        ApiUnreachable,
        SettingsError,
        exit_code,
        run_doctor,
    )

    checks: list[Any] = []

    async def main() -> None:
        checks.extend(await run_doctor(settings, timeout_s=timeout))

    try:
        run_trio(main)
    except SettingsError as exc:
        fail(str(exc), code=EXIT_USAGE)
    except ApiUnreachable as exc:
        if output is OutputFormat.json:
            print_json({"checks": [{"name": "Kubernetes API", "status": "failed",
                                    "detail": str(exc), "fix": ""}],
                        "exit_code": EXIT_UNREACHABLE})
        else:
            out.print(Text.assemble(("✗", _STYLES["failed"]), f" Kubernetes API: {exc}"))
            out.print(Text("    what to do: check the kubeconfig's server address, the "
                           "network path to it (VPN, firewall) and that the API server runs"))
        raise typer.Exit(EXIT_UNREACHABLE) from None
    code = exit_code(checks)
    if output is OutputFormat.json:
        print_json({"checks": [c.to_json() for c in checks], "exit_code": code})
    else:
        _show(checks)
    raise typer.Exit(code)
