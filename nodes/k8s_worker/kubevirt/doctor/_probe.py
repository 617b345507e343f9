"""The doctor's I/O: read what :func:`~._checks.judge` needs through the ``kubernetes`` client.

``GET /version`` first: no answer there means the API server is unreachable
(:class:`ApiUnreachable`, the CLI's exit status 3) and nothing else is asked.
Then every other read at once, each a blocking client call in
``trio.to_thread.run_sync`` under one :class:`trio.CapacityLimiter`
(``api_concurrency``) with the client's own ``request_timeout_s``. A call that
fails becomes a :class:`Reading` with its HTTP status, never an exception:
one missing CRD or one denied read fails its own checks, not the others.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import trio

from nodes.k8s_worker.backend import BackendError

from ..backend import _kube, _transport_errors, default_api_client
from ..permissions import Permission
from ..settings import KubevirtSettings
from ._checks import Check, Observed, Reading, judge, overlay_ref, permission_namespace
from ._checks import permissions_to_ask as _permissions_to_ask
from ._errors import ApiUnreachable, SettingsError

__all__ = ["observe", "run_doctor"]

#: Longest a whole doctor run may take by default (each call also has its own timeout).
DEFAULT_TIMEOUT_S = 60.0


def _message(exc: Any) -> str:
    """The API server's ``Status.message`` of an ``ApiException``, else its reason."""
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except (TypeError, ValueError):
        pass
    return str(exc.reason or "")


class _Reader:
    """Runs client calls in threads and turns every outcome into a :class:`Reading`."""

    def __init__(self, settings: KubevirtSettings) -> None:
        self._timeout_s = settings.request_timeout_s
        self._limiter = trio.CapacityLimiter(settings.api_concurrency)

    async def read(self, fn: Callable[..., Any], *args: Any, items: bool = False) -> Reading:
        """``fn(*args)``; ``items``: the answer is a list whose ``items`` are the objects."""
        kube = _kube()

        def call() -> Any:
            response = fn(*args, _preload_content=False, _request_timeout=self._timeout_s)
            return json.loads(response.data)

        try:
            document = await trio.to_thread.run_sync(call, limiter=self._limiter,
                                                     abandon_on_cancel=True)
        except kube.client.exceptions.ApiException as exc:
            return Reading(int(exc.status or 0), message=_message(exc))
        except _transport_errors() as exc:
            return Reading(0, message=str(exc))
        except ValueError as exc:  # not JSON: a proxy's error page, say
            return Reading(502, message=f"the answer is not JSON: {exc}")
        if not isinstance(document, dict):
            return Reading(502, message="the answer is not a JSON object")
        if items:
            found = document.get("items")
            return Reading(200, tuple(i for i in found if isinstance(i, dict))
                           if isinstance(found, list) else ())
        return Reading(200, (document,))


def _review(permission: Permission, settings: KubevirtSettings) -> dict[str, Any]:
    attributes = {"group": permission.group, "resource": permission.resource,
                  "verb": permission.verb}
    if namespace := permission_namespace(permission, settings):
        attributes["namespace"] = namespace
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes}}


async def observe(api_client: Any, settings: KubevirtSettings) -> Observed:
    """Read everything the checks need.

    Raises:
        ApiUnreachable: ``GET /version`` got no HTTP answer.
    """
    kube = _kube()
    client = kube.client
    reader = _Reader(settings)
    server = str(api_client.configuration.host)
    version = await reader.read(client.VersionApi(api_client).get_code)
    if version.status == 0:
        raise ApiUnreachable(server, version.message)
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    authorization = client.AuthorizationV1Api(api_client)
    results: dict[str, Reading] = {}
    permissions = _permissions_to_ask(settings)
    answers: list[Reading | None] = [None] * len(permissions)

    async def read_into(key: str, fn: Callable[..., Any], *args: Any, items: bool) -> None:
        results[key] = await reader.read(fn, *args, items=items)

    async def ask(index: int, permission: Permission) -> None:
        reading = await reader.read(authorization.create_self_subject_access_review,
                                    _review(permission, settings))
        status = reading.objects[0].get("status") if reading.objects else None
        answers[index] = Reading(reading.status, (status,) if isinstance(status, dict) else (),
                                 reading.message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(read_into, "kubevirt",
                                             custom.list_cluster_custom_object,
                                             "kubevirt.io", "v1", "kubevirts", items=True))
        nursery.start_soon(functools.partial(read_into, "cdi", custom.list_cluster_custom_object,
                                             "cdi.kubevirt.io", "v1beta1", "cdis", items=True))
        nursery.start_soon(functools.partial(read_into, "nodes", core.list_node, items=True))
        nursery.start_soon(functools.partial(
            read_into, "storage", client.StorageV1Api(api_client).list_storage_class,
            items=True))
        if (ref := overlay_ref(settings)) is not None:
            nursery.start_soon(functools.partial(
                read_into, "overlay", custom.get_namespaced_custom_object, "k8s.cni.cncf.io",
                "v1", ref[0], "network-attachment-definitions", ref[1], items=False))
        for index, permission in enumerate(permissions):
            nursery.start_soon(ask, index, permission)
    return Observed(server=server, version=version, kubevirt=results["kubevirt"],
                    cdi=results["cdi"], nodes=results["nodes"],
                    storage_classes=results["storage"], overlay=results.get("overlay"),
                    access=tuple((p, a) for p, a in zip(permissions, answers, strict=True)
                                 if a is not None))


async def run_doctor(settings: KubevirtSettings, *,
                     api_client_factory: Callable[[], Any] | None = None,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Check]:
    """Check the cluster ``settings`` point at; return every check, in report order.

    Args:
        settings: the worker's kubevirt settings (namespace, kubeconfig, GPU
            resource, storage class, overlay, InfiniBand).
        api_client_factory: builds the ``ApiClient`` (tests point it at an API
            double); default: the kubeconfig or in-cluster account of ``settings``.
        timeout_s: bound of the whole run.

    Raises:
        SettingsError: no usable client configuration.
        ApiUnreachable: the API server gave no answer (or none within ``timeout_s``).
    """
    factory = api_client_factory or (lambda: default_api_client(settings))
    try:
        api_client = await trio.to_thread.run_sync(factory)
    except BackendError as exc:
        raise SettingsError(str(exc)) from exc
    try:
        with trio.fail_after(timeout_s):
            observed = await observe(api_client, settings)
    except trio.TooSlowError:
        raise ApiUnreachable(str(api_client.configuration.host),
                             f"no answer within {timeout_s:g} s") from None
    finally:
        api_client.close()
    return judge(observed, settings)
