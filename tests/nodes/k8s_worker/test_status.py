"""The watch-event → VmiEvent mapping, without a server."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.k8s_worker.backend import VmiEvent, VmiPhase
from nodes.k8s_worker.kubevirt.status import DV_PHASES, VMI_PHASES, StatusTracker

NAME = "cac-00112233aabbccdd-r0-n0"


def vmi(phase=None, node=None, conditions=(), **meta):
    status = {"conditions": list(conditions)}
    if phase is not None:
        status["phase"] = phase
    if node is not None:
        status["nodeName"] = node
    return {"metadata": {"name": NAME, **meta}, "status": status}


def dv(phase, **status):
    return {"metadata": {"name": f"{NAME}-root", "labels": {"cosmicac.io/vmi": NAME}},
            "status": {"phase": phase, **status}}


@pytest.mark.parametrize("raw, phase", sorted(VMI_PHASES.items()))
def test_every_kubevirt_phase_has_a_backend_phase_and_a_line(raw, phase):
    event = StatusTracker().on_vmi("MODIFIED", vmi(raw, node="gpu-node-3"))
    assert event.phase is phase and event.message
    if phase is VmiPhase.BOOTING:
        assert event.message == "VMI scheduled on gpu-node-3"


def test_an_unknown_phase_is_unknown():
    assert StatusTracker().on_vmi("MODIFIED", vmi("Hibernating")).phase is VmiPhase.UNKNOWN


def test_nothing_is_sent_twice():
    tracker = StatusTracker()
    assert tracker.on_vmi("ADDED", vmi("Running", node="n1")) is not None
    assert tracker.on_vmi("MODIFIED", vmi("Running", node="n1")) is None


def test_the_disk_import_is_the_vmi_state_until_it_is_done():
    tracker = StatusTracker()
    assert tracker.on_datavolume("ADDED", dv("WaitForFirstConsumer")).phase is \
        VmiPhase.PROVISIONING
    # The VMI appears while the disk waits: still provisioning, same line, nothing new.
    assert tracker.on_vmi("ADDED", vmi("Pending")) is None
    assert tracker.on_datavolume("MODIFIED", dv("ImportInProgress", progress="40%")) == \
        VmiEvent(NAME, VmiPhase.PROVISIONING, "DataVolume importing 40%")
    event = tracker.on_datavolume("MODIFIED", dv(
        "ImportInProgress", progress="41%", restartCount=2,
        conditions=[{"type": "Running", "status": "False", "message": "pull failed"}]))
    assert event.message == "DataVolume importing 41% (importer restarts: 2, pull failed)"
    assert tracker.on_datavolume("MODIFIED", dv("Succeeded")).message == "DataVolume imported"
    assert tracker.on_vmi("MODIFIED", vmi("Pending")) == VmiEvent(
        NAME, VmiPhase.SCHEDULING, "VMI pending")
    running = tracker.on_vmi("MODIFIED", vmi("Running", node="n1"))
    assert running == VmiEvent(NAME, VmiPhase.RUNNING, "VMI running on n1", node="n1")
    # A disk line once running changes the message, not the phase.
    assert tracker.on_datavolume("MODIFIED", dv("Paused")).phase is VmiPhase.RUNNING


def test_a_failed_import_fails_the_vmi():
    tracker = StatusTracker()
    tracker.on_vmi("ADDED", vmi("Pending"))
    event = tracker.on_datavolume("MODIFIED", dv("Failed", conditions=[
        {"type": "Running", "status": "False", "reason": "Error"}]))
    assert event == VmiEvent(NAME, VmiPhase.FAILED, "DataVolume import failed: Error")


def test_deletion_goes_through_terminating_to_gone_and_forgets():
    tracker = StatusTracker()
    tracker.on_vmi("ADDED", vmi("Running", node="n1"))
    terminating = tracker.on_vmi("MODIFIED", vmi("Running", node="n1",
                                                 deletionTimestamp="2026-12-01T00:00:00Z"))
    assert terminating.phase is VmiPhase.RUNNING and terminating.message == "VMI terminating"
    assert tracker.on_vmi("DELETED", vmi("Running")).phase is VmiPhase.GONE
    assert tracker.on_datavolume("DELETED", dv("Succeeded")) is None
    # The name comes back after a restart: reported afresh.
    assert tracker.on_vmi("ADDED", vmi()).phase is VmiPhase.SCHEDULING


def test_a_long_condition_message_is_cut():
    event = StatusTracker().on_vmi("MODIFIED", vmi("Scheduling", conditions=[
        {"type": "PodScheduled", "status": "False", "message": "x" * 5000}]))
    assert event.message.startswith("VMI unschedulable: xxx") and len(event.message) == 500


# Watch objects as a cluster or a broken proxy may send them: each field the tracker
# reads is mostly well-typed (the real names, phases, condition types and statuses, so
# that events get past the checks before it and reach every branch of both handlers)
# and otherwise junk of any JSON type. Fields it never reads would add nothing, so the
# objects stay small.
_scalar = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_junk_of_any_type = (
    _scalar
    | st.lists(_scalar, max_size=2)
    | st.dictionaries(st.text(max_size=4), _scalar, max_size=2)
)


@st.composite
def _or_junk(draw, strategy):
    """A value of ``strategy`` five times in six, junk of any JSON type otherwise.

    (``one_of`` cannot weigh this: it drops repeated branches.)"""
    if draw(st.integers(0, 5)) == 5:
        return draw(_junk_of_any_type)
    return draw(strategy)


_names = _or_junk(st.sampled_from([NAME, NAME, "cac-other-r0-n0", ""]))
_conditions = _or_junk(
    st.lists(
        _or_junk(
            st.fixed_dictionaries(
                {
                    "type": _or_junk(
                        st.sampled_from(["Provisioning", "PodScheduled", "Ready", "Running"])
                    ),
                    "status": _or_junk(st.sampled_from(["True", "False", "Unknown"])),
                },
                optional={
                    "message": _or_junk(st.sampled_from(["", "x" * 600, "pull failed"])),
                    "reason": _or_junk(st.sampled_from(["", "Error"])),
                },
            )
        ),
        max_size=3,
    )
)
_metadata = _or_junk(
    st.fixed_dictionaries(
        {
            "name": _names,
            "labels": _or_junk(st.fixed_dictionaries({"cosmicac.io/vmi": _names})),
        },
        optional={
            "deletionTimestamp": _or_junk(st.sampled_from(["", "2026-12-01T00:00:00Z"])),
        },
    )
)


def _objects(phases):
    return st.fixed_dictionaries(
        {
            "metadata": _metadata,
            "status": _or_junk(
                st.fixed_dictionaries(
                    {
                        "phase": _or_junk(st.sampled_from(phases)),
                        "conditions": _conditions,
                    },
                    optional={
                        "nodeName": _or_junk(st.sampled_from(["", "n1"])),
                        "reason": _or_junk(st.sampled_from(["", "OOMKilled"])),
                        "progress": _or_junk(st.sampled_from(["N/A", "40%"])),
                        "restartCount": _or_junk(st.integers(-1, 3)),
                    },
                )
            ),
        }
    )


_kinds = st.sampled_from(["ADDED", "MODIFIED", "DELETED", "ERROR"])
_events = st.tuples(
    _kinds, st.just(True), _objects([*sorted(VMI_PHASES), "Hibernating"])
) | st.tuples(_kinds, st.just(False), _objects([*sorted(DV_PHASES), "Resizing"]))


@given(st.lists(_events, max_size=10))
def test_any_object_gives_an_event_or_nothing_never_an_error(events):
    tracker = StatusTracker()
    for kind, is_vmi, obj in events:
        result = (tracker.on_vmi if is_vmi else tracker.on_datavolume)(kind, obj)
        assert result is None or isinstance(result, VmiEvent)
