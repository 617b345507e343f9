"""The optional extra ``models`` in tests: skipped where absent, required in CI."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def models_required() -> bool:
    """True where the real-model tests must run rather than skip (CI sets this)."""
    return (
        os.environ.get("CAC_MODELS_REQUIRED") == "1"
        or os.environ.get("CI", "").lower() not in ("", "0", "false")
    )


def need(module: str) -> ModuleType:
    """Import ``module`` of the ``models`` extra, or skip the test saying how to get it.

    In CI (``CI`` set, or ``CAC_MODELS_REQUIRED=1``) a missing module is an
    error, not a skip: CI installs the extra so that these tests run.
    """
    if models_required():
        return importlib.import_module(module)
    return pytest.importorskip(
        module, reason=f"{module} needs the extra 'models' (make install-models)"
    )
