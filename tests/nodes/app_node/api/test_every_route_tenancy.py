"""Tenancy over the whole route table, so a route added later cannot skip it.

Every route in ``ROUTES`` is in :data:`TABLE`, in exactly one class (a route that
is not fails :func:`test_every_route_is_classified`, saying to classify it):

- ``OPEN``: the ways in (sign-up, login, invitation accept, password reset);
- ``ACCOUNT``: the caller's own account (``/me``..., logout, their teams);
- ``PLATFORM``: what any session reads, owned by no team (model masters, swarm keys);
- ``OPERATOR``: platform operators only (racks, nodes, users, health, models, teams);
- a :class:`Team` route: its path, query or body names a team, job, replica, key,
  invitation or member; the table gives the requests that aim it at team A.

With two teams built through the API (:class:`~.conftest.Tenants`: team A with
jobs of both types, their logs, a key with usage, a pending invitation), every
team route aimed at team A from team B's owner, team B's member, a user in no
team and an operator outside team A (but on the quota routes) answers 404 (never
403, never a success), shows none of team A's strings (ids, names, emails,
secrets, log lines) that the request did not carry itself, and leaves team A as
it was, in app-node and in wrk-ork; the same request from team A's owner is not
404 (the probe aims at something real). Every stream (job events, team events,
logs follow) from another team's seat is 404 before any event. Every operator
route is 403 for team A's owner, admin and member, team B's owner and member
and the stranger, and open to the operator. Account and platform routes show no
team A data."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio

from nodes.app_node.api import ROUTES

from .apis import IMAGE, Tenants, bearer
from .support import OPEN, served

pytestmark = pytest.mark.slow


class Kind(enum.Enum):
    OPEN = "open"
    ACCOUNT = "account"
    PLATFORM = "platform"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Probe:
    """One request at team A: ``{name}`` in the path, query values and body strings
    is an id of :attr:`Tenants.a` (or ``b_team``, ``b_owner_id``). ``control``: team A's
    owner gets something other than 404 for it (False when it names team B's things).
    A probe naming ``{b_team}`` acts in team B on team A's thing: team B's member may be
    refused for team B's own reasons (403, needing the admin role there)."""

    path: str
    params: dict[str, str] | None = None
    body: dict[str, Any] | None = None
    control: bool = True

    @property
    def in_team_b(self) -> bool:
        return "{b_team}" in self.path


@dataclass(frozen=True)
class Team:
    """A route that names a team or a team's thing: the requests that aim it at team A.
    ``operators``: inside the team too, only platform operators act (others 403).
    ``any_team``: platform operators reach it for any team, member or not (the quotas);
    on every other team route an operator outside the team is a stranger (404).
    ``stream``: a success would be ``text/event-stream`` (with the probe as sent)."""

    probes: tuple[Probe, ...]
    operators: bool = False
    any_team: bool = False
    stream: bool = False


def T(
    *probes: Probe, operators: bool = False, any_team: bool = False, stream: bool = False
) -> Team:
    return Team(probes, operators, any_team, stream)


P = Probe
BOX = {"name": "x-box", "type": "container", "image": IMAGE, "gpus": 1, "team_id": "{team}"}
LLM = {
    "name": "x-llm",
    "type": "inference",
    "image": IMAGE,
    "gpus": 1,
    "runtime": "vllm",
    "model": "x-model",
    "served_name": "alpha-llm-q7",
    "team_id": "{team}",
}

#: Every route, classified. A new route goes here; see the module doc for the classes.
TABLE: dict[tuple[str, str], Kind | Team] = {
    **dict.fromkeys(OPEN, Kind.OPEN),  # test_every_route's: the ways in
    ("POST", "/auth/logout"): Kind.ACCOUNT,
    ("GET", "/me"): Kind.ACCOUNT,
    ("PATCH", "/me"): Kind.ACCOUNT,
    ("PUT", "/me/password"): Kind.ACCOUNT,
    ("GET", "/teams"): Kind.ACCOUNT,
    ("PUT", "/me/active-team"): T(P("/me/active-team", body={"team_id": "{team}"})),
    ("GET", "/models"): Kind.PLATFORM,
    ("GET", "/swarm"): Kind.PLATFORM,
    ("POST", "/teams"): Kind.OPERATOR,  # teams.creators=operators, the default
    ("GET", "/users"): Kind.OPERATOR,
    ("POST", "/models"): Kind.OPERATOR,
    ("DELETE", "/models/{name:path}"): Kind.OPERATOR,
    ("GET", "/racks"): Kind.OPERATOR,
    ("GET", "/racks/events"): Kind.OPERATOR,
    ("POST", "/racks"): Kind.OPERATOR,
    ("DELETE", "/racks/{rack}"): Kind.OPERATOR,
    ("GET", "/nodes"): Kind.OPERATOR,
    ("POST", "/nodes/reserve"): Kind.OPERATOR,
    ("POST", "/nodes/release"): Kind.OPERATOR,
    ("GET", "/health"): Kind.OPERATOR,
    ("GET", "/health/history"): Kind.OPERATOR,
    ("GET", "/teams/{team}"): T(P("/teams/{team}")),
    ("GET", "/teams/{team}/quota"): T(P("/teams/{team}/quota"), any_team=True),
    ("PATCH", "/teams/{team}/quota"): T(
        P("/teams/{team}/quota", body={"gpus": 0}), operators=True, any_team=True
    ),
    ("GET", "/teams/{team}/members"): T(P("/teams/{team}/members")),
    ("PATCH", "/teams/{team}/members/{user}"): T(
        P("/teams/{team}/members/{member_id}", body={"role": "owner"}),
        P("/teams/{team}/members/{owner_id}", body={"role": "member"}),
        P("/teams/{team}/members/{b_owner_id}", body={"role": "owner"}, control=False),
        P("/teams/{b_team}/members/{member_id}", body={"role": "member"}, control=False),
    ),
    ("DELETE", "/teams/{team}/members/{user}"): T(
        P("/teams/{team}/members/{member_id}"),
        P("/teams/{team}/members/{b_owner_id}", control=False),  # "leave" a team not mine
        P("/teams/{b_team}/members/{admin_id}", control=False),
    ),
    ("POST", "/teams/{team}/invitations"): T(
        P("/teams/{team}/invitations", body={"email": "spy@beta.example", "role": "owner"})
    ),
    ("GET", "/teams/{team}/invitations"): T(P("/teams/{team}/invitations")),
    ("DELETE", "/teams/{team}/invitations/{invitation}"): T(
        P("/teams/{team}/invitations/{invitation}"),
        P("/teams/{b_team}/invitations/{invitation}", control=False),
    ),
    ("POST", "/apikeys"): T(P("/apikeys", body={"name": "x-key", "team_id": "{team}"})),
    ("GET", "/apikeys"): T(P("/apikeys", params={"team_id": "{team}"})),
    ("GET", "/apikeys/usage"): T(P("/apikeys/usage", params={"key": "{key}"})),
    ("DELETE", "/apikeys/{key}"): T(P("/apikeys/{key}")),
    ("POST", "/jobs"): T(P("/jobs", body=BOX), P("/jobs", body=LLM)),
    ("GET", "/jobs"): T(P("/jobs", params={"team_id": "{team}"})),
    ("GET", "/jobs/{job}"): T(P("/jobs/{container}"), P("/jobs/{inference}")),
    ("GET", "/jobs/{job}/wireguard"): T(P("/jobs/{container}/wireguard")),
    ("POST", "/jobs/{job}/restart"): T(
        P("/jobs/{container}/restart"), P("/jobs/{inference}/restart")
    ),
    ("DELETE", "/jobs/{job}"): T(P("/jobs/{container}"), P("/jobs/{inference}")),
    ("POST", "/jobs/{job}/replicas/{replica}/restart"): T(
        P("/jobs/{inference}/replicas/0/restart")
    ),
    ("DELETE", "/jobs/{job}/replicas/{replica}"): T(P("/jobs/{inference}/replicas/1")),
    ("GET", "/jobs/events"): T(P("/jobs/events", params={"team_id": "{team}"}), stream=True),
    ("GET", "/jobs/{job}/events"): T(
        P("/jobs/{container}/events"), P("/jobs/{inference}/events"), stream=True
    ),
    ("GET", "/jobs/{job}/logs"): T(
        P("/jobs/{container}/logs"),
        P("/jobs/{inference}/logs", params={"source": "system"}),
        P("/jobs/{container}/logs", params={"follow": "1"}),
        P("/jobs/{inference}/logs", params={"follow": "1", "since": "1h"}),
        stream=True,
    ),
}

_SPECS = {(r.method, r.path): r for r in ROUTES}


def _of(kind: Kind) -> list[tuple[str, str]]:
    return [k for k, v in TABLE.items() if v is kind and k in _SPECS]


_TEAM = [k for k, v in TABLE.items() if isinstance(v, Team) and k in _SPECS]


def _streams(key: tuple[str, str], probe: Probe) -> bool:
    """Whether a success of ``probe`` would be a stream (the logs route: with ``follow=1``)."""
    entry = TABLE[key]
    if not isinstance(entry, Team) or not entry.stream:
        return False
    return key != ("GET", "/jobs/{job}/logs") or (probe.params or {}).get("follow") == "1"


def _ids(key: tuple[str, str]) -> str:
    return f"{key[0]} {key[1]}"


def test_every_route_is_classified() -> None:
    missing = sorted(set(_SPECS) - set(TABLE))
    assert not missing, (
        f"routes without a tenancy class: {missing}; classify each in TABLE of "
        f"{__name__.replace('.', '/')}.py (OPEN, ACCOUNT, PLATFORM, OPERATOR, or a Team "
        "with the requests that aim it at another team's job, key, member...)"
    )
    stale = sorted(set(TABLE) - set(_SPECS))
    assert not stale, f"TABLE names routes that are gone: {stale}; remove them"


def test_the_open_class_is_exactly_the_routes_without_a_session() -> None:
    assert set(_of(Kind.OPEN)) == {k for k, r in _SPECS.items() if not r.auth}


def test_every_stream_is_classified_as_one() -> None:
    """A route answering ``text/event-stream`` is a team route with ``stream`` set
    (the stream test covers it), and so is the logs route (``follow=1``)."""
    streams = {k for k, r in _SPECS.items() if r.media_type == "text/event-stream"}
    streams.add(("GET", "/jobs/{job}/logs"))
    for key in streams:
        entry = TABLE.get(key)
        assert isinstance(entry, Team) and entry.stream, (
            f"{_ids(key)} streams: classify it as T(..., stream=True)"
        )


# -- the requests -------------------------------------------------------------------------


def _fill(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    return value


def _ids_of(t: Tenants) -> dict[str, str]:
    return {**t.a, "b_team": t.b["team"], "b_owner_id": t.b["owner_id"]}


async def _send(t: Tenants, method: str, probe: Probe, token: str) -> tuple[httpx.Response, str]:
    """The probe as ``token``; with what the request itself carried (for the leak check).
    In-process a stream would be read whole: an answer not back in 10 s is a stream."""
    ids = _ids_of(t)
    path = "/api" + _fill(probe.path, ids)
    params = _fill(probe.params, ids)
    body = _fill(probe.body, ids)
    if body is None and method in ("POST", "PUT", "PATCH"):
        body = {}
    with trio.move_on_after(10) as scope:
        r = await t.api.client.request(
            method, path, params=params, json=body, headers=bearer(token)
        )
    assert not scope.cancelled_caught, f"{method} {path} {params}: answered a stream"
    return r, path + json.dumps(params) + json.dumps(body)


def _leaked(t: Tenants, text: str, sent: str) -> set[str]:
    """Team A's strings in ``text`` that the request did not carry itself."""
    return {s for s in t.secrets if s in text and s not in sent}


async def _team_a(t: Tenants) -> dict[str, Any]:
    """What team A's owner sees of team A: a change by another seat shows here."""
    api, a, owner = t.api, t.a, bearer(t.a_owner)
    seen: dict[str, Any] = {}
    for path, params in (
        (f"/api/teams/{a['team']}", None),
        (f"/api/teams/{a['team']}/members", None),
        (f"/api/teams/{a['team']}/invitations", None),
        ("/api/apikeys", {"team_id": a["team"]}),
        ("/api/apikeys/usage", {"key": a["key"]}),
        ("/api/jobs", {"team_id": a["team"]}),
    ):
        r = await api.client.get(path, params=params, headers=owner)
        assert r.status_code == 200, (path, r.text)
        seen[path] = r.json()
    for user in ("a_owner", "a_admin", "a_member"):
        r = await api.client.get("/api/me", headers=bearer(getattr(t, user)))
        seen[user] = r.json()
    assert api.world is not None  # and wrk-ork's own view: a job made or changed there
    seen["wrk-ork"] = sorted(
        (v.id, v.status.value, tuple((r.index, r.generation, r.status.value) for r in v.replicas))
        for v in api.world.orch.list_jobs()
    )
    return seen


# -- team routes from another team's seat ------------------------------------------------


@pytest.mark.parametrize("key", _TEAM, ids=_ids)
async def test_a_team_route_aimed_at_another_team_is_404_and_leaks_nothing(
    tenants: Tenants, key: tuple[str, str]
) -> None:
    t, entry = tenants, TABLE[key]
    assert isinstance(entry, Team)
    before = await _team_a(t)
    seats = {
        "team B's owner": t.b_owner,
        "team B's member": t.b_member,
        "a user in no team": t.stranger,
    }
    if not entry.any_team:
        seats["an operator outside team A"] = t.operator
    for probe in entry.probes:
        for seat, token in seats.items():
            r, sent = await _send(t, key[0], probe, token)
            assert not _leaked(t, r.text, sent), (seat, key, probe, _leaked(t, r.text, sent))
            if probe.in_team_b and token == t.b_member and r.status_code == 403:
                continue  # refused for its role in team B, before team A's thing is read
            assert r.status_code == 404, (seat, key, probe, r.status_code, r.text)
            assert r.json()["error"]["code"] == "NOT_FOUND", (seat, key, r.text)
    assert await _team_a(t) == before, f"{_ids(key)} from another seat changed team A"
    for probe in entry.probes:  # the probes aim at something real
        if probe.control and not _streams(key, probe):
            r, _ = await _send(t, key[0], probe, t.a_owner)
            assert r.status_code != 404, (key, probe, r.text)


@pytest.mark.parametrize(
    "key", [k for k in _TEAM if TABLE[k].operators or TABLE[k].any_team], ids=_ids
)
async def test_an_operators_team_route(tenants: Tenants, key: tuple[str, str]) -> None:
    """Operators reach it for a team they are not in; where only they act, team A's own
    owner, admin and member get 403."""
    t, entry = tenants, TABLE[key]
    assert isinstance(entry, Team)
    for probe in entry.probes:
        for seat in ("a_member", "a_admin", "a_owner") if entry.operators else ():
            r, _ = await _send(t, key[0], probe, getattr(t, seat))
            assert r.status_code == 403, (seat, key, r.text)
        r, _ = await _send(t, key[0], probe, t.operator)
        assert r.status_code == 200, (key, r.text)


async def test_a_stream_of_another_team_is_404_before_any_event(tenants: Tenants) -> None:
    """Over a real socket (in-process, a stream would be read whole): each stream probe
    from another team's seat ends at once with a JSON 404, no ``event:``; team A's owner
    gets the stream."""
    t, ids = tenants, _ids_of(tenants)
    async with served(t.api) as client:
        for key in _TEAM:
            entry = TABLE[key]
            assert isinstance(entry, Team)
            if not entry.stream:
                continue
            for probe in entry.probes:
                path, params = _fill(probe.path, ids), _fill(probe.params, ids)
                for token in (t.b_owner, t.b_member, t.stranger):
                    with trio.fail_after(10):
                        async with client.stream(
                            key[0], path, params=params, headers=bearer(token)
                        ) as r:
                            text = (await r.aread()).decode()
                    assert r.status_code == 404, (key, probe, text)
                    assert r.headers["content-type"].startswith("application/json"), text
                    sent = path + json.dumps(params)
                    assert "event:" not in text and not _leaked(t, text, sent), (key, text)
                if not _streams(key, probe):
                    continue  # not a stream as sent: the route test has its control
                with trio.fail_after(10):
                    async with client.stream(
                        key[0], path, params=params, headers=bearer(t.a_owner)
                    ) as r:
                        assert r.status_code == 200, (key, probe)
                        assert r.headers["content-type"].startswith("text/event-stream")


# -- operators, accounts, the platform ----------------------------------------------------


async def _check_each(t: Tenants, keys: list[tuple[str, str]], check) -> None:
    """``check(t, key)`` for every key on the same tenants; every route is checked, and
    each failing one's assertion is told at the end (as one test per route would).
    Sharing the tenants holds only if no route's requests change team A: checked."""
    assert keys
    before, failures = await _team_a(t), []
    for key in keys:
        try:
            await check(t, key)
        except AssertionError as exc:
            failures.append(f"{_ids(key)}: {exc}")
    assert not failures, "\n".join(failures)
    assert await _team_a(t) == before, "these routes' requests changed team A"


async def test_every_operator_route_is_403_for_everyone_else(tenants: Tenants) -> None:
    """All on one set of tenants (one build per route cost ~0.1 CPU-s each): a 403
    changes nothing, nor do the operator's own requests (empty bodies, a model and a
    rack nobody made)."""
    await _check_each(tenants, _of(Kind.OPERATOR), _operator_route_is_403_for_everyone_else)


async def _operator_route_is_403_for_everyone_else(t: Tenants, key: tuple[str, str]) -> None:
    probe = P(key[1].replace("{name:path}", "alpha-model-q7").replace("{rack}", "0" * 64))
    for seat in ("a_member", "a_admin", "a_owner", "b_owner", "b_member", "stranger"):
        r, sent = await _send(t, key[0], probe, getattr(t, seat))
        assert r.status_code == 403, (seat, key, r.text)
        assert not _leaked(t, r.text, sent), (seat, key, r.text)
    if key in _OPERATOR_STREAMS:
        return  # the operator's stream would not end here: test_racks.py reads it served
    r, _ = await _send(t, key[0], probe, t.operator)
    assert r.status_code != 403, (key, r.text)


#: Operator routes that stream (their refusal comes before any event).
_OPERATOR_STREAMS = {("GET", "/racks/events")}


async def test_every_account_or_platform_route_shows_no_other_team(tenants: Tenants) -> None:
    """All on one set of tenants: each request is on a session of its own (a logout
    ends only that one)."""
    await _check_each(
        tenants,
        _of(Kind.ACCOUNT) + _of(Kind.PLATFORM),
        _account_or_platform_route_shows_no_other_team,
    )


async def _account_or_platform_route_shows_no_other_team(t: Tenants, key: tuple[str, str]) -> None:
    for email in ("owner@beta.example", "member@beta.example", "stranger@gamma.example"):
        token = await t.api.login(email)  # a session of its own: logout, password
        r, sent = await _send(t, key[0], P(key[1]), token)
        assert r.status_code < 500, (email, key, r.text)
        assert not _leaked(t, r.text, sent), (email, key, _leaked(t, r.text, sent))
        if TABLE[key] is Kind.PLATFORM:
            assert r.status_code == 200, (email, key, r.text)


async def test_another_team_may_serve_the_same_model_name(tenants: Tenants) -> None:
    """Served names are a team's own: team B serving the name team A's job serves is
    no conflict (a 409 would tell team B what team A runs, and block it)."""
    t = tenants
    r = await t.api.client.post(
        "/api/jobs",
        headers=bearer(t.b_owner),
        json={
            "name": "b-llm",
            "type": "inference",
            "image": IMAGE,
            "gpus": 1,
            "runtime": "vllm",
            "model": "alpha-model-q7",
            "team_id": t.b["team"],
        },
    )
    assert r.status_code == 201, r.text
    assert not _leaked(t, r.text, "alpha-model-q7"), r.text
