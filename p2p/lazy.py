"""Names of a package imported on their first use (PEP 562), so a process that never
uses them never loads their modules (``cosmicac shell`` at an address loads no
pydantic model, relay client or in-memory network)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, str],
               namespace: MutableMapping[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports a name from its module in
    ``where`` (relative, e.g. ``"._messages"``) on first use and keeps it in
    ``namespace`` (the package's ``globals()``), so the next use is a plain lookup."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(module, package), name)
        return value

    return __getattr__
