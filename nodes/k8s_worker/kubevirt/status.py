"""Sans-IO: VMI and DataVolume watch events → :class:`VmiEvent`.

The backend's watch threads hand every event (``ADDED``/``MODIFIED``/
``DELETED`` plus the object as a dict) to :class:`StatusTracker`, which keeps
the last phase and System log line per VMI and returns the
:class:`VmiEvent` to send when either changed. The tables below are the
whole mapping (reference/kubevirt-cdi-vllm.md §1.8, §2); the README draws
them.

A DataVolume's events are reported under its VMI's name (label
``cosmicac.io/vmi``): while the VMI has not started, the disk's progress *is*
the VMI's state (:attr:`VmiPhase.PROVISIONING`); once it runs, a DataVolume
line changes the message only. A failed import fails the VMI: KubeVirt would
hold it in ``Provisioning`` forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodes.k8s_worker.backend import VmiEvent, VmiPhase

from .render import LABEL_VMI

__all__ = ["DV_PHASES", "VMI_PHASES", "StatusTracker"]

#: KubeVirt ``status.phase`` → backend phase.
VMI_PHASES: dict[str, VmiPhase] = {
    "": VmiPhase.SCHEDULING,
    "Pending": VmiPhase.SCHEDULING,
    "Scheduling": VmiPhase.SCHEDULING,
    "WaitingForSync": VmiPhase.SCHEDULING,
    "Scheduled": VmiPhase.BOOTING,
    "Running": VmiPhase.RUNNING,
    "Succeeded": VmiPhase.SUCCEEDED,
    "Failed": VmiPhase.FAILED,
    "Unknown": VmiPhase.UNKNOWN,
}

#: CDI ``status.phase`` → the System log line it gives (progress appended
#: while importing). ``Failed`` fails the VMI; the rest are provisioning.
DV_PHASES: dict[str, str] = {
    "": "DataVolume created",
    "Pending": "DataVolume pending",
    "PVCBound": "DataVolume claim bound",
    "WaitForFirstConsumer": "DataVolume waiting for its VMI (first consumer)",
    "PendingPopulation": "DataVolume waiting for its VMI (pending population)",
    "ImportScheduled": "DataVolume import scheduled",
    "ImportInProgress": "DataVolume importing",
    "Paused": "DataVolume import paused",
    "Succeeded": "DataVolume imported",
    "Failed": "DataVolume import failed",
    "Unknown": "DataVolume state unknown",
}

#: A System line is cut here; condition messages from the cluster can be long.
_MAX_LINE_CHARS = 500

#: VMI phases during which the disk's state is the VMI's state.
_BEFORE_START = frozenset({VmiPhase.PROVISIONING, VmiPhase.SCHEDULING})


def _dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else empty: a malformed field reads as absent."""
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    """``value`` if it is a string, else "" (same reason)."""
    return value if isinstance(value, str) else ""


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = _dict(obj.get("status")).get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, dict) and condition.get("type") == kind:
            return condition
    return None


def _why(condition: dict[str, Any] | None) -> str:
    condition = _dict(condition)
    return _str(condition.get("message")) or _str(condition.get("reason"))


@dataclass
class _Seen:
    phase: VmiPhase
    message: str
    node: str | None = None
    dv_restarts: int = 0


class StatusTracker:
    """The last known state per VMI name; turns watch events into :class:`VmiEvent`."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}
        #: VMI name → its DataVolume's last line while the disk is not ready
        #: (a pending VMI then reports the disk's progress).
        self._disk_line: dict[str, str] = {}

    def forget(self, name: str) -> None:
        """Drop what is known of VMI ``name`` (after its delete completed)."""
        self._seen.pop(name, None)
        self._disk_line.pop(name, None)

    def _emit(self, name: str, phase: VmiPhase, message: str,
              node: str | None) -> VmiEvent | None:
        message = message[:_MAX_LINE_CHARS]
        seen = self._seen.get(name)
        if seen is not None and (seen.phase, seen.message, seen.node) == (phase, message, node):
            return None
        if seen is None:
            self._seen[name] = _Seen(phase, message, node)
        else:
            seen.phase, seen.message, seen.node = phase, message, node
        return VmiEvent(name=name, phase=phase, message=message, node=node)

    def on_vmi(self, kind: str, obj: dict[str, Any]) -> VmiEvent | None:
        """One VMI watch event; returns the event to report, or None if nothing changed."""
        meta = _dict(obj.get("metadata"))
        name = _str(meta.get("name"))
        if not name:
            return None
        status = _dict(obj.get("status"))
        node = _str(status.get("nodeName")) or None
        if kind == "DELETED":
            # Forgotten at once: the name may come back (a restart), and a
            # deleted VMI's DataVolume events say nothing about a VMI.
            self.forget(name)
            return VmiEvent(name=name, phase=VmiPhase.GONE, message="VMI deleted")
        if meta.get("deletionTimestamp"):
            seen = self._seen.get(name)
            phase = seen.phase if seen is not None else VmiPhase.UNKNOWN
            return self._emit(name, phase, "VMI terminating", node)
        raw_phase = _str(status.get("phase"))
        phase = VMI_PHASES.get(raw_phase, VmiPhase.UNKNOWN)
        if phase is VmiPhase.SCHEDULING:
            provisioning = _condition(obj, "Provisioning")
            scheduled = _condition(obj, "PodScheduled")
            importing = name in self._disk_line
            # No node fits outranks the disk's progress: it is what needs a human.
            if scheduled is not None and scheduled.get("status") == "False":
                why = _why(scheduled) or "no node fits"
                message = f"VMI unschedulable: {why}"
            elif importing or (provisioning is not None and provisioning.get("status") == "True"):
                phase = VmiPhase.PROVISIONING
                message = self._disk_line.get(name, "VMI waiting for its DataVolume")
            else:
                message = "VMI scheduling" if raw_phase == "Scheduling" else "VMI pending"
        elif phase is VmiPhase.BOOTING:
            message = f"VMI scheduled on {node}" if node else "VMI scheduled"
        elif phase is VmiPhase.RUNNING:
            ready = _condition(obj, "Ready")
            message = f"VMI running on {node}" if node else "VMI running"
            if ready is not None and ready.get("status") == "True":
                message += ", ready"
        elif phase is VmiPhase.FAILED:
            why = _str(status.get("reason"))
            message = f"VMI failed: {why}" if why else "VMI failed"
        elif phase is VmiPhase.SUCCEEDED:
            message = "VMI stopped (guest shut down)"
        else:
            message = f"VMI state unknown (phase {raw_phase!r})"
        return self._emit(name, phase, message, node)

    def on_datavolume(self, kind: str, obj: dict[str, Any]) -> VmiEvent | None:
        """One DataVolume watch event, reported under its VMI's name."""
        meta = _dict(obj.get("metadata"))
        name = _str(_dict(meta.get("labels")).get(LABEL_VMI))
        if not name:
            return None
        seen = self._seen.get(name)
        if meta.get("deletionTimestamp") and seen is None:
            return None  # the disk of a deleted VMI going away
        if kind == "DELETED":
            if seen is None or seen.phase is VmiPhase.GONE:
                return None
            return self._emit(name, seen.phase, "DataVolume deleted", seen.node)
        status = _dict(obj.get("status"))
        raw_phase = _str(status.get("phase"))
        line = DV_PHASES.get(raw_phase, f"DataVolume {raw_phase}")
        progress = status.get("progress")
        if raw_phase == "ImportInProgress" and isinstance(progress, str) and progress != "N/A":
            line = f"{line} {progress}"
        restarts = status.get("restartCount")
        if isinstance(restarts, int) and not isinstance(restarts, bool) and restarts > 0:
            why = _why(_condition(obj, "Running"))
            line = f"{line} (importer restarts: {restarts}{', ' + why if why else ''})"
        if raw_phase == "Failed":
            why = _why(_condition(obj, "Running")) or _why(_condition(obj, "Ready"))
            return self._emit(name, VmiPhase.FAILED, f"{line}: {why}" if why else line,
                              seen.node if seen else None)
        if raw_phase == "Succeeded":
            self._disk_line.pop(name, None)
        else:
            self._disk_line[name] = line
        if seen is None or seen.phase in _BEFORE_START:
            return self._emit(name, VmiPhase.PROVISIONING, line, seen.node if seen else None)
        if seen.phase is VmiPhase.GONE:
            return None
        return self._emit(name, seen.phase, line, seen.node)
