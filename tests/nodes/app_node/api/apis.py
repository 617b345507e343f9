"""An app-node API on real parts in tmp_path: the store file, a shared-database
replica, an outbox folder, an embedded limiter, a fake wall clock; cheap scrypt.

``ork_api`` adds a real wrk-ork in-process: an ``OrkService`` over the
orchestrator of ``tests/nodes/ork/world.World`` (one rack of two 8-GPU nodes)
on its own swarm, reached by a real ``OrkClient`` on a second swarm, and
app-node's ``JobHub`` and ``JobProjection`` following its ``jobs.watch`` as the
daemon's do (the fixture waits until the projection is synced, so listings and
job pages read it). A test that plays the worker (``world.say``) calls
:meth:`Api.say` so the change also reaches the watch (wrk-ork's daemon pumps
after every report; here the service pumps after every RPC call only), then
waits until app-node's copy has it (:meth:`Api.settled`): it comes through the
watch, not through the call.

``logs_api`` is ``ork_api`` plus a real wrk-monitor: a ``MonitorService`` over a
``LogBuffer`` on a third swarm that lets app-node's key follow, reached by a
real ``MonitorClient``; tests append records to ``Api.log_buffer``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from crdt import Database, FsyncPolicy
from nodes.app_node.api import BodyLimits, create_app
from nodes.app_node.auth import ScryptParams
from nodes.app_node.email import OutboxSender
from nodes.app_node.job_events import JobHub, follow_ork
from nodes.app_node.job_projection import JobProjection
from nodes.app_node.ratelimit import EmbeddedLimiter, Limits, Rate
from nodes.app_node.services import AppServices
from nodes.app_node.store import Store
from nodes.app_node.team_rules import TeamCreators, TeamsSettings
from nodes.kit.monitor_client import MonitorClient
from nodes.kit.ork_client import OrkClient
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.agent_metrics import AgentMetricsBook
from nodes.monitor.agent_metrics import install as install_agent_metrics
from nodes.monitor.service import MonitorService
from nodes.ork.service import OrkService
from p2p.keys import KeyPair
from p2p.swarm import Swarm, SwarmConfig, UpkeepPolicy

from ....p2p.helpers import wait_until
from ...ork.world import World

PASSWORD = "correct horse battery"
CHEAP = ScryptParams(ln=4, r=8, p=1)
#: ``services.teams`` for a test where a user who is not an operator makes a team
#: (the default lets operators only).
EVERYONE_CREATES = TeamsSettings(creators=TeamCreators.EVERYONE)
GENEROUS = Limits(per_token=Rate(per_second=1000.0, burst=10_000),
                  per_ip=Rate(per_second=1000.0, burst=10_000))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Api:
    client: httpx.AsyncClient
    services: AppServices
    clock: FakeClock
    outbox: Path
    #: With ``ork_api``: wrk-ork's world and the cancel scope that stops its swarm.
    world: World | None = None
    ork_scope: trio.CancelScope | None = None
    ork_service: OrkService | None = None
    #: With ``logs_api``: wrk-monitor's buffer (append records to it).
    log_buffer: LogBuffer | None = None
    monitor_scope: trio.CancelScope | None = None
    #: With ``logs_api``: wrk-monitor's service (its ``health`` book takes reports).
    monitor_service: MonitorService | None = None
    #: With ``ork_api``: stop wrk-ork's swarm and start a new service over the
    #: same jobs, key and port (wrk-ork restarted: its revision starts again).
    restart_ork: Callable[[], Awaitable[None]] | None = None

    def say(self, replica: int, state: str, **kwargs) -> None:
        """The worker reports ``state`` (``World.say``), and wrk-ork streams the change."""
        assert self.world is not None and self.ork_service is not None
        self.world.say(replica, state, **kwargs)
        self.ork_service.pump()

    async def settled(self) -> None:
        """Until app-node's copy of the jobs is at wrk-ork's revision (what wrk-ork
        pumped has reached it through the watch)."""
        assert self.ork_service is not None and self.services.jobs is not None
        jobs, service = self.services.jobs, self.ork_service
        await wait_until(lambda: jobs.synced and jobs.revision >= service.revision,
                         step_s=0.005)

    async def signup(self) -> str:
        r = await self.client.post("/api/auth/signup", json={
            "email": "admin@example.com", "name": "Ada", "password": PASSWORD,
            "team_name": "core"})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    async def user(self, email: str, team: str, role: str, admin_token: str) -> str:
        """A user created straight in the store, made ``role`` of ``team``; their token."""
        return await self.account(email, team=team, role=role)

    async def account(self, email: str, *, team: str | None = None,
                      role: str = "member") -> str:
        """A user created straight in the store (in no team unless ``team``); their token."""
        from nodes.app_node.auth import hash_password
        store = self.services.store
        user = store.users.create(email=email, name=email.split("@")[0],
                                  password_hash=hash_password(PASSWORD, params=CHEAP),
                                  now=self.clock.now)
        if team is not None:
            store.teams.add_member(team, user.id, role)
        return await self.login(email)

    async def login(self, email: str) -> str:
        """A new session of ``email`` (whose password is ``PASSWORD``)."""
        r = await self.client.post("/api/auth/login", json={"email": email,
                                                            "password": PASSWORD})
        assert r.status_code == 200, r.text
        return r.json()["token"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def make_api(tmp_path: Path, limits: Limits = GENEROUS,
                   ork: OrkClient | None = None,
                   events: JobHub | None = None,
                   jobs: JobProjection | None = None,
                   monitor: MonitorClient | None = None,
                   body_limits: BodyLimits = BodyLimits()) -> AsyncIterator[Api]:
    clock = FakeClock()
    store = Store.open(tmp_path / "app.sqlite")
    database = await Database.open(tmp_path / "db", KeyPair.generate(),
                                   fsync=FsyncPolicy.NEVER)
    outbox = tmp_path / "outbox"
    services = AppServices(store=store, database=database, ork=ork,
                           email=OutboxSender(outbox, clock_ns=lambda: int(clock.now * 1e9)),
                           limiter=EmbeddedLimiter(), limits=limits,
                           public_url="https://cosmic.example", clock=clock,
                           events=events, jobs=jobs, monitor=monitor)
    app = create_app(services, password_params=CHEAP, body_limits=body_limits)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        try:
            yield Api(client, services, clock, outbox)
        finally:
            await database.aclose()
            store.close()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async for value in make_api(tmp_path):
        yield value


FAST = UpkeepPolicy(base_s=0.05, max_s=0.2, dial_timeout_s=2.0)


@pytest.fixture
async def ork_api(tmp_path: Path) -> AsyncIterator[Api]:
    async for value in _with_ork(tmp_path, monitor=False):
        yield value


@pytest.fixture
async def logs_api(tmp_path: Path) -> AsyncIterator[Api]:
    async for value in _with_ork(tmp_path, monitor=True):
        yield value


async def _with_ork(tmp_path: Path, *, monitor: bool) -> AsyncIterator[Api]:
    world, ork_key, me = World(nodes=(8, 8)), KeyPair.generate(), KeyPair.generate()
    service = OrkService(world.orch, allow=lambda key: key == me.public_key,
                         clock=lambda: world.now)
    ork_swarm = Swarm(ork_key, config=SwarmConfig(host="127.0.0.1", port=0),
                      services=[service])
    scope = trio.CancelScope()

    async def run_ork(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await ork_swarm.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        address = await nursery.start(run_ork)

        async def restart_ork() -> None:
            nonlocal service, ork_swarm, scope
            scope.cancel()
            await trio.sleep(0.05)  # the old swarm's sockets close
            service = OrkService(world.orch, allow=lambda key: key == me.public_key,
                                 clock=lambda: world.now)
            ork_swarm = Swarm(ork_key, config=SwarmConfig(host="127.0.0.1", port=address[1]),
                              services=[service])
            scope = trio.CancelScope()
            await nursery.start(run_ork)
            value.ork_scope, value.ork_service = scope, service
        swarm = Swarm(me, config=SwarmConfig(host="127.0.0.1", port=0))
        await nursery.start(swarm.run)
        client = OrkClient(swarm, ork_key.public_key, addresses=[address], backoff=FAST)
        await nursery.start(client.run)
        hub, projection = JobHub(), JobProjection()
        await nursery.start(follow_ork, client, hub, projection)
        # Listings and job pages read the copy from here on.
        await wait_until(lambda: projection.synced, step_s=0.005)
        buffer, monitor_client, monitor_scope = None, None, trio.CancelScope()
        monitor_service = None
        if monitor:
            buffer = LogBuffer()
            monitor_service = MonitorService(buffer, followers={me.public_key})
            install_agent_metrics(monitor_service, AgentMetricsBook())  # as the daemon does
            monitor_swarm = Swarm(KeyPair.generate(),
                                  config=SwarmConfig(host="127.0.0.1", port=0),
                                  services=[monitor_service])

            async def run_monitor(task_status=trio.TASK_STATUS_IGNORED) -> None:
                with monitor_scope:
                    await monitor_swarm.run(task_status=task_status)

            monitor_address = await nursery.start(run_monitor)
            monitor_client = MonitorClient(swarm, monitor_swarm.keypair.public_key,
                                           addresses=[monitor_address], backoff=FAST,
                                           timeout_s=1.0)
            await nursery.start(monitor_client.run)
        async for value in make_api(tmp_path, ork=client, events=hub, jobs=projection,
                                    monitor=monitor_client):
            value.world, value.ork_scope, value.ork_service = world, scope, service
            value.log_buffer, value.monitor_scope = buffer, monitor_scope
            value.monitor_service = monitor_service
            value.restart_ork = restart_ork
            yield value
        nursery.cancel_scope.cancel()


IMAGE = "docker://registry.local/jobs/app:1"


@dataclass
class Tenants:
    """Three teams on one ``logs_api``: the operators' team (the first admin's, made at
    sign-up), team A with real content, team B; and a stranger in no team.

    Team A: an owner, an admin, a member; a container job and an inference job (the
    member's and the owner's), their log records in wrk-monitor's buffer, an API key
    with usage rows, a pending invitation. Team B: an owner and a member. Tokens are
    sessions; ``a`` holds team A's ids by name (``team``, ``container``, ``inference``,
    ``key``, ``invitation``, ``owner_id``, ``admin_id``, ``member_id``), and
    ``secrets`` every string of team A's that no other seat may read."""

    api: Api
    operator: str
    a_owner: str
    a_admin: str
    a_member: str
    b_owner: str
    b_member: str
    stranger: str
    a: dict[str, str]
    b: dict[str, str]
    secrets: set[str]


async def _json(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()


async def make_tenants(api: Api) -> Tenants:
    from contracts.monitor import make_record
    from crdt import AddTokenUsage
    store, now = api.services.store, api.clock.now
    operator = await api.signup()
    a_owner = await api.account("owner@alpha-q7.example")
    a_owner_id = store.users.by_email("owner@alpha-q7.example").id
    team_a = store.teams.create(name="alpha-team-q7", owner=a_owner_id, now=now).id
    a_admin = await api.account("admin@alpha-q7.example", team=team_a, role="admin")
    a_member = await api.account("member@alpha-q7.example", team=team_a, role="member")
    b_owner = await api.account("owner@beta.example")
    b_owner_id = store.users.by_email("owner@beta.example").id
    team_b = store.teams.create(name="beta", owner=b_owner_id, now=now).id
    b_member = await api.account("member@beta.example", team=team_b, role="member")
    stranger = await api.account("stranger@gamma.example")

    container = await _json(await api.client.post("/api/jobs", headers=bearer(a_member), json={
        "name": "alpha-box-q7", "type": "container", "image": IMAGE, "gpus": 1,
        "team_id": team_a}), 201)
    inference = await _json(await api.client.post("/api/jobs", headers=bearer(a_owner), json={
        "name": "alpha-llm-q7", "type": "inference", "image": IMAGE, "gpus": 1,
        "replicas": 2, "runtime": "vllm", "model": "alpha-model-q7", "team_id": team_a}), 201)
    key = await _json(await api.client.post("/api/apikeys", headers=bearer(a_member), json={
        "name": "alpha-key-q7", "team_id": team_a}), 201)
    await api.services.database.append([AddTokenUsage(
        key["id"], "alpha-model-q7", "2027-01-02", prompt=10, completion=5, total=15)])
    invitation = await _json(await api.client.post(
        f"/api/teams/{team_a}/invitations", headers=bearer(a_owner),
        json={"email": "invitee@alpha-q7.example", "role": "member"}), 201)
    assert api.log_buffer is not None
    api.log_buffer.append([make_record(f"alpha-log-q7 {job['id']}", service="agent",
                                       job_id=job["id"], replica=0, time_ns=int(now * 1e9))
                           for job in (container, inference)])

    a = {"team": team_a, "container": container["id"], "inference": inference["id"],
         "key": key["id"], "invitation": invitation["id"], "owner_id": a_owner_id,
         "admin_id": store.users.by_email("admin@alpha-q7.example").id,
         "member_id": store.users.by_email("member@alpha-q7.example").id}
    b = {"team": team_b, "owner_id": b_owner_id,
         "member_id": store.users.by_email("member@beta.example").id}
    secrets = {*a.values(), "alpha-team-q7", "alpha-box-q7", "alpha-llm-q7", "alpha-key-q7",
               "alpha-model-q7", "alpha-log-q7", key["key"], key["prefix"],
               "invitee@alpha-q7.example", "owner@alpha-q7.example",
               "admin@alpha-q7.example", "member@alpha-q7.example"}
    return Tenants(api, operator, a_owner, a_admin, a_member, b_owner, b_member, stranger,
                   a, b, secrets)


@pytest.fixture
async def tenants(logs_api: Api) -> Tenants:
    return await make_tenants(logs_api)
