"""The worker's start-up check: the doctor's findings as log warnings, never a refusal.

A worker that cannot reach its cluster at start may still be right to run
(the API server may come back; the queue keeps operations until then), so
nothing here stops it: failed checks are logged as warnings, advice as info,
and the whole run is bounded by ``timeout_s``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from ..settings import KubevirtSettings
from ._checks import Check, Status
from ._errors import DoctorError
from ._probe import run_doctor

__all__ = ["STARTUP_TIMEOUT_S", "warn_at_start"]

log = logging.getLogger(__name__)

#: Bound of the start-up check: long enough for ~20 calls to a slow API server.
STARTUP_TIMEOUT_S = 60.0


async def warn_at_start(settings: KubevirtSettings, *,
                        api_client_factory: Callable[[], Any] | None = None,
                        timeout_s: float = STARTUP_TIMEOUT_S) -> list[Check]:
    """Run the doctor's checks and log what they found; return the checks (empty if
    the doctor could not run). Never raises but for cancellation."""
    try:
        with trio.fail_after(timeout_s):
            checks = await run_doctor(settings, api_client_factory=api_client_factory,
                                      timeout_s=timeout_s)
    except (DoctorError, trio.TooSlowError) as exc:
        log.warning("doctor.not_run reason=%r (run: cosmicac doctor)", str(exc) or "timed out")
        return []
    except Exception:  # a bug in a check must not stop the worker
        log.warning("doctor.crashed (run: cosmicac doctor)", exc_info=True)
        return []
    failed = [c for c in checks if c.status is Status.FAILED]
    for check in checks:
        if check.status is Status.FAILED:
            log.warning("doctor.check_failed check=%r detail=%r fix=%r",
                        check.name, check.detail, check.fix)
        elif check.status is Status.WARNING:
            log.info("doctor.advice check=%r detail=%r fix=%r", check.name, check.detail,
                     check.fix)
    log.info("doctor.done checks=%d failed=%d", len(checks), len(failed))
    return checks
