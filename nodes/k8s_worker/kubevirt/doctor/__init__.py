"""``cosmicac doctor``: can this cluster run the ``kubevirt`` backend's jobs?

:mod:`._checks` judges (pure: API answers → one :class:`Check` per
requirement), :mod:`._probe` reads the answers through the ``kubernetes``
client in threads, :mod:`._startup` is the worker's start-up run (warnings in
its log). The permissions it checks are the table of :mod:`..permissions`.
"""

from ._checks import Check, Observed, Reading, Status, exit_code, judge
from ._errors import ApiUnreachable, DoctorError, SettingsError
from ._probe import DEFAULT_TIMEOUT_S, observe, run_doctor
from ._startup import STARTUP_TIMEOUT_S, warn_at_start

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "STARTUP_TIMEOUT_S",
    "ApiUnreachable",
    "Check",
    "DoctorError",
    "Observed",
    "Reading",
    "SettingsError",
    "Status",
    "exit_code",
    "judge",
    "observe",
    "run_doctor",
    "warn_at_start",
]
