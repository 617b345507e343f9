"""Memberships against a model (a team always keeps an owner, whatever the order of
adds, role changes, removals and user deletions), listings at scale, and threads."""

from __future__ import annotations

import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from contracts.model import JobSpec, JobType
from nodes.app_node.errors import Conflict, LastOwner, NotFound
from nodes.app_node.model import Role
from nodes.app_node.store import Store
from tests.examples import examples

T0 = 1_000_000.0
USERS = 5
TEAMS = 3

roles = st.sampled_from(list(Role))
user_index = st.integers(0, USERS - 1)
team_index = st.integers(0, TEAMS - 1)


class Memberships(RuleBasedStateMachine):
    """The store must agree with a dict of roles and refuse exactly what would orphan a team."""

    @initialize()
    def setup(self) -> None:
        self.store = Store.open(None)
        self.users = [self.store.users.create(email=f"u{i}@x", name=f"U{i}", password_hash="h",
                                              now=T0).id for i in range(USERS)]
        self.alive = set(self.users)
        self.teams = [self.store.teams.create(name=f"T{i}", owner=self.users[i], now=T0).id
                      for i in range(TEAMS)]
        self.roles: dict[str, dict[str, Role]] = {
            team: {self.users[i]: Role.OWNER} for i, team in enumerate(self.teams)}

    def teardown(self) -> None:
        self.store.close()

    def _owners(self, team: str, without: str) -> int:
        return sum(1 for user, role in self.roles[team].items()
                   if role is Role.OWNER and user != without)

    @rule(t=team_index, u=user_index, role=roles)
    def add(self, t: int, u: int, role: Role) -> None:
        team, user = self.teams[t], self.users[u]
        if user not in self.alive:
            with pytest.raises(NotFound):
                self.store.teams.add_member(team, user, role)
        elif user in self.roles[team]:
            with pytest.raises(Conflict):
                self.store.teams.add_member(team, user, role)
        else:
            self.store.teams.add_member(team, user, role)
            self.roles[team][user] = role

    @rule(t=team_index, u=user_index, role=roles)
    def change(self, t: int, u: int, role: Role) -> None:
        team, user = self.teams[t], self.users[u]
        current = self.roles[team].get(user)
        if current is None:
            with pytest.raises(NotFound):
                self.store.teams.change_role(team, user, role)
        elif current is Role.OWNER and role is not Role.OWNER and not self._owners(team, user):
            with pytest.raises(LastOwner):
                self.store.teams.change_role(team, user, role)
        else:
            self.store.teams.change_role(team, user, role)
            self.roles[team][user] = role

    @rule(t=team_index, u=user_index)
    def remove(self, t: int, u: int) -> None:
        team, user = self.teams[t], self.users[u]
        current = self.roles[team].get(user)
        if current is None:
            with pytest.raises(NotFound):
                self.store.teams.remove_member(team, user)
        elif current is Role.OWNER and not self._owners(team, user):
            with pytest.raises(LastOwner):
                self.store.teams.remove_member(team, user)
        else:
            self.store.teams.remove_member(team, user)
            del self.roles[team][user]

    @rule(u=user_index)
    def delete_user(self, u: int) -> None:
        user = self.users[u]
        if user not in self.alive:
            with pytest.raises(NotFound):
                self.store.users.delete(user)
            return
        orphans = [team for team, members in self.roles.items()
                   if members.get(user) is Role.OWNER and not self._owners(team, user)]
        if orphans:
            with pytest.raises(LastOwner):
                self.store.users.delete(user)
        else:
            self.store.users.delete(user)
            self.alive.discard(user)
            for members in self.roles.values():
                members.pop(user, None)

    @invariant()
    def every_team_keeps_an_owner_and_matches_the_model(self) -> None:
        for team in self.teams:
            members = {user.id: role for user, role in self.store.teams.members(team)}
            assert members == self.roles[team]
            assert Role.OWNER in members.values()
            for user in self.users:
                assert self.store.teams.role_of(user, team) == self.roles[team].get(user)


TestMemberships = Memberships.TestCase
TestMemberships.settings = settings(max_examples=examples(60), stateful_step_count=40,
                                    deadline=None)


def test_listing_1000_jobs_and_100_users_page_by_page(tmp_path):
    store = Store.open(tmp_path / "app.sqlite")
    admin, team = store.users.create_first_admin(email="a@x", name="A", password_hash="h",
                                                 team_name="Core", now=T0)
    other = store.teams.create(name="Other", owner=admin.id, now=T0)
    users = [admin.id] + [store.users.create(email=f"user{i:03}@x", name=f"U{i}",
                                             password_hash="h", now=T0 + i).id
                          for i in range(99)]
    jobs = []
    for i in range(1000):
        on = team.id if i % 10 else other.id
        store.jobs.add(id=f"job-{i:04}", team=on, created_by=users[i % 100], now=T0 + i,
                       spec=JobSpec(name=f"job {i}", team=on, type=JobType.CONTAINER,
                                   image="docker://registry.local/cuda:12", gpus=1))
        if on == team.id:
            jobs.append(f"job-{i:04}")
    for i in range(0, 1000, 7):
        if f"job-{i:04}" in jobs:
            store.jobs.mark_deleted(f"job-{i:04}", now=T0 + 2000)
    live = [j for j in reversed(jobs) if int(j[4:]) % 7]

    for limit in (1, 33, 100, 500):
        seen, cursor, pages = [], None, 0
        while pages < 2000:
            page = store.jobs.page(team.id, limit=limit, cursor=cursor)
            assert len(page.items) <= limit
            seen += [job.id for job in page.items]
            pages += 1
            if page.next is None:
                break
            cursor = page.next
        assert seen == live, limit
    every = store.jobs.page(team.id, limit=500, include_deleted=True)
    assert [job.id for job in every.items] == list(reversed(jobs))[:500]

    # A job added between pages does not shift the pages already being read.
    first = store.jobs.page(team.id, limit=10)
    store.jobs.add(id="late", team=team.id, created_by=admin.id, now=T0 + 5000,
                   spec=JobSpec(name="late", team=team.id, type=JobType.CONTAINER,
                               image="docker://registry.local/cuda:12", gpus=1))
    second = store.jobs.page(team.id, limit=10, cursor=first.next)
    assert [j.id for j in first.items + second.items] == live[:20]

    seen, cursor = [], None
    for _ in range(100):
        page = store.users.page(limit=7, cursor=cursor)
        seen += [user.id for user in page.items]
        if page.next is None:
            break
        cursor = page.next
    assert seen == users
    store.close()


def test_threads_racing_for_the_first_admin_make_exactly_one(tmp_path):
    store = Store.open(tmp_path / "app.sqlite")
    results: list[object] = []
    barrier = threading.Barrier(8)

    def sign_up(i: int) -> None:
        barrier.wait(timeout=10)
        try:
            results.append(store.users.create_first_admin(
                email=f"a{i}@x", name="A", password_hash="h", team_name=f"T{i}", now=T0))
        except Conflict as exc:
            results.append(exc)

    threads = [threading.Thread(target=sign_up, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sum(not isinstance(r, Conflict) for r in results) == 1
    assert len(results) == 8
    assert len(store.users.page().items) == 1 and len(store.teams.all()) == 1
    store.close()
