"""RBAC as the API server evaluates it, over parsed manifests: which requests they grant.

Only what the worker's manifests use: Roles and ClusterRoles with
``apiGroups``/``resources``/``verbs`` (``*`` honoured), RoleBindings and
ClusterRoleBindings to one ServiceAccount. No aggregation, no
``resourceNames``, no non-resource URLs (the tests add Kubernetes' default
grants for those).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .kube_double import Access

__all__ = ["granted", "grants", "ungranted"]


def _matches(values: list[str], value: str) -> bool:
    return "*" in values or value in values


def _bound_rules(documents: list[dict[str, Any]], account: tuple[str, str]
                 ) -> Iterable[tuple[str | None, dict[str, Any]]]:
    """(namespace or None for cluster-wide, rule) of every rule bound to ``account``."""
    namespace, name = account
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in documents if d["kind"] in ("Role", "ClusterRole")}
    for binding in documents:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == name
                   and s.get("namespace") == namespace for s in binding.get("subjects") or ()):
            continue
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role_ns = where if ref["kind"] == "Role" else None
        for rule in roles.get((ref["kind"], role_ns, ref["name"]), {}).get("rules") or ():
            yield where, rule


def granted(documents: list[dict[str, Any]], account: tuple[str, str], access: Access) -> bool:
    """Whether the manifests let ``account`` (namespace, name) make ``access``."""
    for where, rule in _bound_rules(documents, account):
        if where is not None and where != access.namespace:
            continue  # a RoleBinding grants in its own namespace only
        if _matches(rule.get("apiGroups") or [], access.group) \
                and _matches(rule.get("resources") or [], access.resource) \
                and _matches(rule.get("verbs") or [], access.verb):
            return True
    return False


def ungranted(documents: list[dict[str, Any]], account: tuple[str, str],
              accesses: Iterable[Access]) -> set[Access]:
    """The accesses the manifests do not grant."""
    return {a for a in accesses if not granted(documents, account, a)}


def grants(documents: list[dict[str, Any]], account: tuple[str, str]
           ) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) granted somewhere (no wildcards expected)."""
    return {(group, resource, verb) for _, rule in _bound_rules(documents, account)
            for group in rule.get("apiGroups") or () for resource in rule.get("resources") or ()
            for verb in rule.get("verbs") or ()}
