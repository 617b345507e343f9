"""Who may call wrk-ork (least privilege between daemons).

Every method of cosmicac-ork/1 by every kind of caller (app-node, proxy-inference,
a registered rack's worker, a stranger's key, no proven key) gets exactly the
answer the table intends: the proxy reads and follows jobs and changes nothing;
only app-node manages jobs and racks; a method missing from the table is
refused to everyone; an empty allow-list refuses everything.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
from pydantic import BaseModel

from cli.up import APP, ORK, PROXY, WORKER, Ports, service_configs
from contracts.health import STATUS, StatusRequest
from contracts.ork import (
    CREATE_JOB,
    DELETE_JOB,
    DELETE_REPLICA,
    GET_JOB,
    LIST_JOBS,
    LIST_NODES,
    LIST_RACKS,
    PREVIEW_JOB,
    PROTOCOL,
    REGISTER_RACK,
    RELEASE_NODES,
    REMOVE_RACK,
    RESERVE_NODES,
    RESTART_JOB,
    RESTART_REPLICA,
    WATCH_JOBS,
    CreateJob,
    Empty,
    JobRef,
    JobResult,
    ListJobs,
    RackRef,
    RegisterRack,
    ReleaseNodes,
    ReplicaRef,
    ReserveNodes,
    WatchJobs,
)
from nodes.ork.access import OrkAccess, Role
from nodes.ork.service import ACCESS, MAX_WATCHERS_PER_KEY, OrkService
from nodes.ork.settings import OrkSettings
from p2p.rpc import Method, RpcClient, RpcError, StreamMethod
from tests.p2p.mux_pairs import rpc_client_of

from .world import OTHER_RACK, RACK, World, container, inference

APP_KEY = b"\x01" * 32
PROXY_KEY = b"\x03" * 32
WORKER_KEY = bytes.fromhex(RACK)
STRANGER = b"\x02" * 32

#: The intent, written out (not read from ACCESS): the proxy reads and follows
#: jobs; app-node does everything; workers and strangers nothing.
PROXY_METHODS = {"jobs.get", "jobs.list", "jobs.watch"}
EVERY_METHOD = {
    "jobs.create", "jobs.preview", "jobs.get", "jobs.list", "jobs.restart", "jobs.delete",
    "jobs.watch",
    "replicas.restart", "replicas.delete", "racks.register", "racks.list", "racks.remove",
    "nodes.list", "nodes.reserve", "nodes.release", "service.status",
}
CALLERS = {"app-node": APP_KEY, "proxy": PROXY_KEY, "worker": WORKER_KEY,
           "stranger": STRANGER, "no key": None}


def intended(method: str, caller: str) -> bool:
    return caller == "app-node" or (caller == "proxy" and method in PROXY_METHODS)


class Harness:
    """An orchestrator with a rack (two nodes), an empty second rack and a job."""

    def __init__(self, access: OrkAccess) -> None:
        self.world = World(nodes=(4, 4))
        self.world.orch.register_rack(OTHER_RACK, "default", self.world.now, name="spare")
        self.job = self.world.create(inference(gpus=1, replicas=2))
        self.world.say(0, "active")
        self.world.say(1, "active")
        self.world.orch.drain_events()
        self.service = OrkService(self.world.orch, roles=access.roles_of,
                                  clock=lambda: self.world.now)

    def state(self) -> tuple:
        """Everything a call could change."""
        orch = self.world.orch
        return (orch.list_jobs(), orch.racks(), orch.nodes(), orch.outbox())


def access_for_test() -> OrkAccess:
    return OrkAccess.from_settings(app_nodes=[APP_KEY], proxies=[PROXY_KEY],
                                   is_rack=lambda key: key == WORKER_KEY)


def connect(nursery, service: OrkService, key: bytes | None):
    return rpc_client_of(nursery, service.router, key, protocol=PROTOCOL)


def example_call(method: str, harness: Harness) -> tuple[Method | StreamMethod, BaseModel]:
    """A call of ``method`` that app-node could make, on the harness's world."""
    job = harness.job.id
    return {
        "jobs.create": (CREATE_JOB, CreateJob(spec=container())),
        "jobs.preview": (PREVIEW_JOB, CreateJob(spec=container())),
        "jobs.get": (GET_JOB, JobRef(job_id=job)),
        "jobs.list": (LIST_JOBS, ListJobs()),
        "jobs.restart": (RESTART_JOB, JobRef(job_id=job)),
        "jobs.delete": (DELETE_JOB, JobRef(job_id=job)),
        "jobs.watch": (WATCH_JOBS, WatchJobs(snapshot=True)),
        "replicas.restart": (RESTART_REPLICA, ReplicaRef(job_id=job, replica=1)),
        "replicas.delete": (DELETE_REPLICA, ReplicaRef(job_id=job, replica=1)),
        "racks.register": (REGISTER_RACK, RegisterRack(rack="ef" * 32)),
        "racks.list": (LIST_RACKS, Empty()),
        "racks.remove": (REMOVE_RACK, RackRef(rack=OTHER_RACK)),
        "nodes.list": (LIST_NODES, Empty()),
        "nodes.reserve": (RESERVE_NODES, ReserveNodes(rack=RACK, nodes=["n1"], team="team-b")),
        "nodes.release": (RELEASE_NODES, ReleaseNodes(rack=RACK, nodes=["n1"])),
        "service.status": (STATUS, StatusRequest()),
    }[method]


async def attempt(client: RpcClient, method: Method | StreamMethod, params: BaseModel
                  ) -> str | None:
    """Make the call; its error code, or None if it was answered."""
    try:
        if isinstance(method, StreamMethod):
            async with client.stream(method, params) as items:
                async for _ in items:
                    break  # the snapshot's first job: served
        else:
            await client.call(method, params)
    except RpcError as exc:
        return exc.code
    return None


def test_the_table_names_every_method_wrk_ork_serves_and_only_jobs_reads_are_the_proxys():
    """Every method served has its line; every one but the proxy's three is app-node's
    alone (a method added later, e.g. pushing a team's keys to its jobs, included)."""
    service = Harness(access_for_test()).service
    assert set(ACCESS) == service.router.names
    assert set(ACCESS) >= EVERY_METHOD
    for method, roles in ACCESS.items():
        wanted = {Role.APP_NODE, Role.PROXY} if method in PROXY_METHODS else {Role.APP_NODE}
        assert roles == wanted, method


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("method", sorted(EVERY_METHOD))
async def test_each_method_answers_exactly_the_roles_it_is_meant_for(
        nursery, autojump_clock, method, caller):
    harness = Harness(access_for_test())
    rpc_method, params = example_call(method, harness)
    before = harness.state()
    with trio.fail_after(10):
        async with connect(nursery, harness.service, CALLERS[caller]) as client:
            code = await attempt(client, rpc_method, params)
    if intended(method, caller):
        # Answered, or refused by the orchestrator itself (e.g. INVALID_STATE:
        # one replica of an Active job is not deleted alone): it got that far.
        assert code != "FORBIDDEN", f"{caller} was refused {method}"
    else:
        assert code == "FORBIDDEN", f"{caller} calling {method} got {code}"
        assert harness.state() == before  # a refused call changed nothing
        refused = harness.service.access.statistics().refused
        assert refused == {method: 1}


async def test_a_proxy_key_cannot_delete_a_job_or_remove_a_rack(nursery, autojump_clock):
    """With wrk-ork configured as `cosmicac up` and `bootstrap` write it:
    the internet-facing proxy's key reads and follows jobs, and that is all."""
    keys = {name: key.hex() for name, key in ((APP, APP_KEY), (PROXY, PROXY_KEY),
                                              (WORKER, WORKER_KEY))}
    keys |= {name: bytes([n]).hex() * 32 for n, name in enumerate(
        ("relay", "wrk-ork", "wrk-monitor"), start=0x10)}
    config = service_configs(Path("/srv"), Ports.from_base(49737),
                             keys)[ORK]
    settings = OrkSettings.model_validate(config)
    access = OrkAccess.from_settings(app_nodes=settings.app_nodes, proxies=settings.proxies,
                                     clients=settings.clients)
    assert access.roles_of(PROXY_KEY) == {Role.PROXY}
    assert access.roles_of(APP_KEY) == {Role.APP_NODE}
    harness = Harness(access)
    before = harness.state()
    with trio.fail_after(10):
        async with connect(nursery, harness.service, PROXY_KEY) as proxy:
            for method, params in [(DELETE_JOB, JobRef(job_id=harness.job.id)),
                                   (REMOVE_RACK, RackRef(rack=OTHER_RACK)),
                                   (CREATE_JOB, CreateJob(spec=container()))]:
                with pytest.raises(RpcError) as refused:
                    await proxy.call(method, params)
                assert refused.value.code == "FORBIDDEN"
                assert "app-node only" in refused.value.message
            # What it needs still works: every job, and their changes.
            listed = (await proxy.call(LIST_JOBS, ListJobs())).jobs
            assert [job.id for job in listed] == [harness.job.id]
    assert harness.state() == before  # the job still runs, both racks are there
    assert harness.world.orch.get_job(harness.job.id).status == "active"
    assert {rack.key for rack in harness.world.orch.racks()} == {RACK, OTHER_RACK}


class Secret(BaseModel):
    pass


async def test_a_method_missing_from_the_table_is_refused_even_to_app_node(
        nursery, autojump_clock):
    """A method added to the router without its line in ACCESS is closed, not open;
    a name nobody serves is FORBIDDEN too (a stranger learns nothing of what exists)."""
    harness = Harness(access_for_test())
    ran = []

    async def handler(params, ctx) -> Secret:
        ran.append(ctx.remote_public_key)
        return Secret()

    added = Method("jobs.push_keys", params=Secret, result=Secret)
    harness.service.router.add(added, handler)
    nobody = Method("no.such", params=Secret, result=Secret)
    with trio.fail_after(10):
        for key in (APP_KEY, STRANGER):
            async with connect(nursery, harness.service, key) as client:
                for method in (added, nobody):
                    with pytest.raises(RpcError) as refused:
                        await client.call(method, Secret())
                    assert refused.value.code == "FORBIDDEN"
    assert ran == []
    assert harness.service.access.statistics().refused == {"(unlisted)": 4}


@pytest.mark.parametrize("caller", list(CALLERS))
async def test_an_empty_allow_list_refuses_every_call(nursery, autojump_clock, caller):
    harness = Harness(OrkAccess())
    assert OrkAccess().empty
    with trio.fail_after(10):
        async with connect(nursery, harness.service, CALLERS[caller]) as client:
            for method in sorted(EVERY_METHOD):
                assert await attempt(client, *example_call(method, harness)) == "FORBIDDEN"


def test_the_old_clients_list_gives_the_app_node_role():
    access = OrkAccess.from_settings(clients=[APP_KEY, PROXY_KEY], proxies=[STRANGER])
    assert access.roles_of(APP_KEY) == access.roles_of(PROXY_KEY) == {Role.APP_NODE}
    assert access.roles_of(STRANGER) == {Role.PROXY}
    assert not access.empty and access.roles_of(b"\x09" * 32) == frozenset()


async def test_the_daemon_started_with_empty_allow_lists_refuses_and_says_so(
        tmp_path, caplog, capsys):
    """The real start path (nodes/ork/daemon.py) with no app_nodes, proxies or
    clients: it serves, refuses every call, and logs why; with the deprecated
    ``clients`` it warns and treats them as app-nodes."""
    from nodes.kit.ork_client import OrkClient
    from nodes.kit.ready import find_ready
    from nodes.ork.daemon import start_ork
    from p2p.daemon import Daemon
    from p2p.keys import KeyPair
    from p2p.metrics import ProcessMetrics
    from p2p.swarm import Swarm, SwarmConfig

    caplog.set_level(logging.WARNING, logger="nodes.ork.daemon")
    me = KeyPair.generate()
    with trio.fail_after(60):
        for n, clients in enumerate(((), (me.hex,))):
            storage = tmp_path / f"ork-{n}"
            storage.mkdir()
            settings = OrkSettings(storage=storage, host="127.0.0.1", port=0, fsync=False,
                                   clients=clients)
            async with trio.open_nursery() as nursery:
                daemon = Daemon(name="wrk-ork", settings=settings, nursery=nursery,
                                metrics=ProcessMetrics(), storage=storage)
                await start_ork(daemon)
                ready = find_ready(capsys.readouterr().out, "wrk-ork")
                assert ready is not None and ready.key is not None
                swarm = Swarm(me, config=SwarmConfig(host="127.0.0.1", port=0))
                await nursery.start(swarm.run)
                client = OrkClient(swarm, bytes.fromhex(ready.key),
                                   addresses=[ready.address("swarm")])
                await nursery.start(client.run)
                if not clients:
                    with pytest.raises(RpcError) as refused:
                        await client.call(LIST_JOBS, ListJobs())
                    assert refused.value.code == "FORBIDDEN"
                    assert "has no role at wrk-ork" in refused.value.message
                else:
                    result = await client.call(CREATE_JOB, CreateJob(spec=container()))
                    assert isinstance(result, JobResult)
                nursery.cancel_scope.cancel()
    messages = [record.getMessage() for record in caplog.records]
    assert sum("ork.no_callers" in m for m in messages) == 1
    assert sum("ork.clients_deprecated" in m for m in messages) == 1


async def test_the_proxy_cannot_take_every_watch_slot_from_app_node(nursery, autojump_clock):
    """Following jobs is the proxy's right, but one key holds at most
    MAX_WATCHERS_PER_KEY streams: app-node keeps getting its job events."""
    harness = Harness(access_for_test())
    with trio.fail_after(10):
        async with connect(nursery, harness.service, PROXY_KEY) as proxy:
            streams = []
            for _ in range(MAX_WATCHERS_PER_KEY):
                stream = proxy.stream(WATCH_JOBS, WatchJobs(snapshot=True))
                items = await stream.__aenter__()
                streams.append(stream)
                await items.__anext__()  # served: it holds a slot now
            assert harness.service.watchers == MAX_WATCHERS_PER_KEY
            assert await attempt(proxy, WATCH_JOBS, WatchJobs(snapshot=True)) == \
                "TOO_MANY_WATCHERS"
            async with connect(nursery, harness.service, APP_KEY) as app:
                assert await attempt(app, WATCH_JOBS, WatchJobs(snapshot=True)) is None
            for stream in streams:
                await stream.__aexit__(None, None, None)
