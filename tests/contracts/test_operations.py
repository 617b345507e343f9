"""contracts/operations.py: every queue message round-trips, and the decoders of
both sides refuse anything else with BadMessage only (fuzzed)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.model import JobSpec, NodeInfo, NodeShare, RackReport, ReplicaPlacement, ReplicaState
from contracts.operations import (
    BadMessage,
    CreateReplica,
    DeleteReplica,
    RackUpdate,
    ReplicaReport,
    RestartReplica,
    SetShellKeys,
    decode_operation,
    decode_report,
    encode,
)
from contracts.shell_access import ShellKeys

RACK = "ab" * 32
SPEC = JobSpec(name="shell", team="team-a", type="container",
               image="docker://registry.local/jobs/app:1", gpus=2)

OPERATIONS = [
    CreateReplica(op_id="j-1/0/create/0", job_id="j-1", replica=0, spec=SPEC,
                  placement=ReplicaPlacement(rack=RACK, shares=(NodeShare(node="n1", gpus=2),)),
                  generation=0),
    RestartReplica(op_id="j-1/0/restart/1", job_id="j-1", replica=0, generation=1),
    DeleteReplica(op_id="j-1/0/delete/1", job_id="j-1", replica=0),
    SetShellKeys(op_id="team-a/3", keys=ShellKeys(team="team-a", keys=("cd" * 32,), version=3)),
]
REPORTS = [
    ReplicaReport(job_id="j-1", replica=0, state=ReplicaState.ACTIVE, generation=1,
                  message="agent ready", agents=("ef" * 32,), at=1_700_000_000.5),
    RackUpdate(rack=RackReport(nodes=(NodeInfo(name="n1", gpus=8),), overlay_network=True),
               at=1_700_000_000.0),
]


@pytest.mark.parametrize("message", OPERATIONS, ids=lambda m: m.kind)
def test_every_operation_round_trips_and_is_no_report(message):
    payload = encode(message)
    assert decode_operation(payload) == message
    with pytest.raises(BadMessage):
        decode_report(payload)


@pytest.mark.parametrize("message", REPORTS, ids=lambda m: m.kind)
def test_every_report_round_trips_and_is_no_operation(message):
    payload = encode(message)
    assert decode_report(payload) == message
    with pytest.raises(BadMessage):
        decode_operation(payload)


def test_an_unknown_field_is_refused():
    raw = msgpack.unpackb(encode(OPERATIONS[2]))
    raw["force"] = True
    with pytest.raises(BadMessage, match="force"):
        decode_operation(msgpack.packb(raw))


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=6),
    max_leaves=20,
)


def _decoded_or_refused(payload: bytes) -> None:
    for decode in (decode_operation, decode_report):
        try:
            decode(payload)
        except BadMessage:
            pass


@given(st.binary(max_size=512))
def test_fuzz_any_bytes(data):
    _decoded_or_refused(data)


@given(msgpack_values)
def test_fuzz_any_msgpack_value(value):
    _decoded_or_refused(msgpack.packb(value, use_bin_type=True))


@given(st.sampled_from(OPERATIONS + REPORTS), st.text(max_size=12), msgpack_values)
def test_fuzz_a_valid_message_with_one_field_replaced(message, field, value):
    raw = msgpack.unpackb(encode(message))
    raw[field if field else next(iter(raw))] = value
    _decoded_or_refused(msgpack.packb(raw, use_bin_type=True))
