"""An isolated network's gateway in the contracts: what it carries, and what older
peers (``extra="forbid"``) still read when a job has none."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.gateway import GatewayView
from contracts.model import JobSpec, NodeInfo, RackReport, ReplicaState
from contracts.operations import ReplicaReport
from contracts.ork import ReplicaStatus, ReplicaView

KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
GATEWAY = GatewayView(public_key=KEY, endpoint="gw.example.net:30000",
                      tunnel_subnet="10.250.0.0/24", networks=("10.88.0.0/24",))


def test_without_a_gateway_or_isolated_network_nothing_new_is_sent():
    report = ReplicaReport(job_id="j-1", replica=0, state=ReplicaState.ACTIVE, at=1.0)
    assert "gateway" not in report.model_dump(mode="json")
    view = ReplicaView(index=0, status=ReplicaStatus.ACTIVE, generation=0, placement=None,
                       message="")
    assert "gateway" not in view.model_dump(mode="json")
    rack = RackReport(nodes=(NodeInfo(name="n", gpus=8),))
    assert "isolated_networks" not in rack.model_dump(mode="json")
    spec = JobSpec(name="b", team="t", type="container", image="docker://r/x", gpus=1)
    assert "isolated_network" not in spec.model_dump(mode="json")


def test_a_gateway_travels_whole():
    report = ReplicaReport(job_id="j-1", replica=0, state=ReplicaState.ACTIVE, at=1.0,
                           gateway=GATEWAY)
    assert ReplicaReport.model_validate(report.model_dump(mode="json")).gateway == GATEWAY
    assert RackReport.model_validate(RackReport(
        nodes=(), isolated_networks=True).model_dump(mode="json")).isolated_networks


@pytest.mark.parametrize("change", [
    {"public_key": "not-a-key"}, {"endpoint": "no port"}, {"tunnel_subnet": "10.250.0.1/24"},
    {"networks": ()}, {"networks": ("nonsense",)},
])
def test_a_bad_gateway_is_refused(change):
    with pytest.raises(ValidationError):
        GatewayView(**{**GATEWAY.model_dump(), **change})


def test_only_a_container_job_takes_an_isolated_network():
    with pytest.raises(ValidationError, match="only a GPU Container Job"):
        JobSpec(name="m", team="t", type="inference", image="docker://r/x", gpus=1,
                runtime="vllm", model="m", isolated_network=True)
