"""The routing table, a pure function of wrk-ork's job views."""

from __future__ import annotations

from contracts.inference import job_topic
from contracts.model import JobSpec, JobStatus
from contracts.ork import JobView, ReplicaStatus, ReplicaView
from nodes.proxy_inference.router import RoutingTable

from .harness import IMAGE, inference_spec, job_view

A, B, C, D = (bytes([i]) * 32 for i in range(1, 5))


def replica(index: int, status: ReplicaStatus, *agents: bytes) -> ReplicaView:
    return ReplicaView(index=index, status=status, generation=0, placement=None, message="",
                       agents=tuple(a.hex() for a in agents))


def job(job_id: str, spec: JobSpec, status: JobStatus, *replicas: ReplicaView,
        created_at: float = 1.0) -> JobView:
    return JobView(id=job_id, spec=spec, status=status, reason="", created_at=created_at,
                   updated_at=created_at, rack=None, replicas=replicas)


def test_a_model_routes_to_its_teams_active_or_degraded_job_only():
    table = RoutingTable.from_jobs([
        job_view("j1", inference_spec("chat"), [A]),
        job_view("j2", inference_spec("chat", team="team-b"), [B]),
        job_view("j3", inference_spec("half"), [C], status=JobStatus.DEGRADED),
        job_view("j4", inference_spec("soon"), [D], status=JobStatus.STARTING,
                 replica_status=ReplicaStatus.STARTING),
    ])
    assert table.lookup("team-a", "chat").job_id == "j1"
    assert table.lookup("team-b", "chat").job_id == "j2"
    assert table.lookup("team-a", "half").job_id == "j3"
    assert table.lookup("team-a", "soon") is None
    assert table.lookup("team-c", "chat") is None
    assert [r.served_name for r in table.models("team-a")] == ["chat"]  # Active only


def test_the_served_name_defaults_to_the_model():
    spec = JobSpec(name="x", team="t", type="inference", image=IMAGE, gpus=1, runtime="local",
                   model="gemma-3-270m")
    table = RoutingTable.from_jobs([job_view("j", spec, [A])])
    assert table.lookup("t", "gemma-3-270m").job_id == "j"


def test_container_jobs_are_not_routed():
    spec = JobSpec(name="box", team="t", type="container", image=IMAGE, gpus=1)
    assert RoutingTable.from_jobs([job("j", spec, JobStatus.ACTIVE)]).jobs == {}


def test_endpoints_are_the_rank_0_agents_of_active_replicas_and_every_listed_agent_passes():
    spec = inference_spec("big", replicas=3)
    view = job("j", spec, JobStatus.DEGRADED,
               replica(0, ReplicaStatus.ACTIVE, A, B),     # two nodes: A serves
               replica(1, ReplicaStatus.FAILED, C),
               replica(2, ReplicaStatus.ACTIVE, D))
    table = RoutingTable.from_jobs([view])
    route = table.lookup("team-a", "big")
    assert route.endpoints == (A, D)
    assert route.agents == {A, B, C, D}
    topic = job_topic("j")
    assert table.allows(B, topic) and not table.allows(b"\x09" * 32, topic)
    assert not table.allows(A, job_topic("other"))
    assert table.endpoint_keys() == {A, D}


def test_two_live_jobs_with_one_name_prefer_active_then_the_newer():
    spec = inference_spec("dup")
    degraded = job("j-old", spec, JobStatus.DEGRADED, created_at=5.0)
    active = job("j-act", spec, JobStatus.ACTIVE, created_at=1.0)
    newer = job("j-new", spec, JobStatus.ACTIVE, created_at=9.0)
    assert RoutingTable.from_jobs([degraded, active]).lookup("team-a", "dup").job_id == "j-act"
    assert RoutingTable.from_jobs([newer, active]).lookup("team-a", "dup").job_id == "j-new"


def test_a_starting_job_with_an_active_replica_is_routed_to_it():
    spec = inference_spec("two", replicas=2)
    view = job("j", spec, JobStatus.STARTING,
               replica(0, ReplicaStatus.STARTING, A),  # its model server restarts
               replica(1, ReplicaStatus.ACTIVE, B))
    table = RoutingTable.from_jobs([view])
    route = table.lookup("team-a", "two")
    assert route.endpoints == (B,) and route.connect == {A, B}
    assert table.models("team-a") == []  # listed once Active
    nothing_up = job("j", spec, JobStatus.STARTING, replica(0, ReplicaStatus.STARTING, A),
                     replica(1, ReplicaStatus.STARTING, B))
    assert RoutingTable.from_jobs([nothing_up]).lookup("team-a", "two") is None
    failed = job("j", spec, JobStatus.DEGRADED, replica(0, ReplicaStatus.FAILED, A),
                 replica(1, ReplicaStatus.ACTIVE, B))
    assert RoutingTable.from_jobs([failed]).lookup("team-a", "two").connect == {B}
