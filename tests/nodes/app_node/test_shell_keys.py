"""app-node keeps wrk-ork told of every team's shell keys.

A real store and a real orchestrator behind a stand-in for the wrk-ork client
(its ``call`` runs ``teams.set_shell_keys`` on the orchestrator, as the service
does): removing a member, a new CLI key, a new member, a disabled or deleted
user each reach wrk-ork on the next pass; unchanged teams are not sent again;
a restarted app-node sends every team once and wrk-ork tells no rack; a clock
that went back still wins.
"""

from __future__ import annotations

import itertools

import trio

from contracts.operations import SetShellKeys
from contracts.ork import SET_SHELL_KEYS
from contracts.shell_access import MAX_SHELL_KEYS, ShellKeys, ShellKeysAck
from nodes.app_node.model import Role
from nodes.app_node.shell_keys import ShellKeySync
from nodes.app_node.store import Store
from nodes.kit.ork_client import OrkUnavailable

from ...p2p.helpers import wait_until
from ..ork.world import World, container

T0 = 1_000_000.0
A, B, C = "aa" * 32, "bb" * 32, "cc" * 32


class Ork:
    """wrk-ork as app-node's client sees it: the orchestrator answers the call."""

    def __init__(self) -> None:
        self.world = World()
        self.calls: list[ShellKeys] = []
        self.down = False

    async def call(self, method, params):
        assert method is SET_SHELL_KEYS
        if self.down:
            raise OrkUnavailable("wrk-ork could not be reached")
        self.calls.append(params)
        version, applied = self.world.orch.set_shell_keys(params)
        return ShellKeysAck(version=version, applied=applied)

    def held(self, team: str) -> tuple[str, ...] | None:
        found = self.world.orch.shell_keys(team)
        return None if found is None else found.keys

    def sent_to_racks(self) -> list[ShellKeys]:
        ops = [o for o in self.world.orch.outbox() if isinstance(o.op, SetShellKeys)]
        self.world.orch.mark_published([o.op_id for o in ops])
        return [o.op.keys for o in ops]


def people(store: Store):
    users = {name: store.users.create(email=f"{name}@x", name=name, password_hash="h", now=T0)
             for name in ("ann", "bo", "cy")}
    team = store.teams.create(name="T", owner=users["ann"].id, now=T0)
    store.teams.add_member(team.id, users["bo"].id, Role.MEMBER)
    store.users.set_cli_key(users["ann"].id, A)
    store.users.set_cli_key(users["bo"].id, B)
    return users, team.id


async def test_membership_and_key_changes_reach_wrk_ork_on_the_next_pass():
    store, ork = Store.open(None), Ork()
    users, team = people(store)
    ork.world.create(container(team=team))
    ork.world.orch.mark_published([o.op_id for o in ork.world.orch.outbox()])
    clock = itertools.count(1)
    sync = ShellKeySync(store, ork, clock_ns=lambda: next(clock))
    assert await sync.sync_once() == 1 and ork.held(team) == (A, B)
    assert ork.sent_to_racks() == [ShellKeys(team=team, keys=(A, B), version=1)]
    assert await sync.sync_once() == 0  # nothing changed: nothing sent

    steps = [
        (lambda: store.teams.remove_member(team, users["bo"].id), (A,)),  # removed
        (lambda: store.teams.add_member(team, users["cy"].id, Role.MEMBER), (A,)),  # no key yet
        (lambda: store.users.set_cli_key(users["cy"].id, C), (A, C)),  # logs in
        (lambda: store.users.set_cli_key(users["ann"].id, B), (B, C)),  # new workstation
        (lambda: store.users.update(users["cy"].id, disabled=True), (B,)),  # disabled
        (lambda: store.teams.change_role(team, users["ann"].id, Role.OWNER), (B,)),  # no change
        (lambda: store.users.delete(users["cy"].id), (B,)),  # no change
    ]
    for change, expected in steps:
        before = ork.held(team)
        change()
        await sync.sync_once()
        assert ork.held(team) == expected
        sent = ork.sent_to_racks()
        assert [s.keys for s in sent] == ([] if expected == before else [expected])


async def test_a_restarted_app_node_sends_every_team_once_and_a_late_clock_still_wins():
    store, ork = Store.open(None), Ork()
    _, team = people(store)
    ork.world.create(container(team=team))
    await ShellKeySync(store, ork, clock_ns=lambda: 1_000).sync_once()
    ork.sent_to_racks()
    # Restarted with a clock that went back: wrk-ork holds 1,000, above it.
    again = ShellKeySync(store, ork, clock_ns=lambda: 10)
    assert await again.sync_once() == 1
    assert [c.version for c in ork.calls[-2:]] == [10, 1_001]
    assert ork.sent_to_racks() == []  # the same keys: no rack is bothered
    assert again.sent[team].version == 1_001


async def test_a_pass_that_fails_is_tried_again(thread_clock):
    store, ork = Store.open(None), Ork()
    users, team = people(store)
    sync = ShellKeySync(store, ork, interval_s=1.0)
    ork.down = True
    async with trio.open_nursery() as nursery:
        await nursery.start(sync.run)
        await trio.sleep(0.5)
        assert ork.held(team) is None and sync.sends == 0
        ork.down = False
        await wait_until(lambda: ork.held(team) == (A, B), limit_s=5)
        store.teams.remove_member(team, users["bo"].id)
        sync.nudge()
        # A nudge does not wait for the interval.
        await wait_until(lambda: ork.held(team) == (A,), limit_s=0.5, step_s=0.01)
        nursery.cancel_scope.cancel()


async def test_a_team_over_the_key_bound_is_logged_and_the_others_still_sent(caplog):
    store, ork = Store.open(None), Ork()
    _, team = people(store)
    big = store.teams.create(name="Big", owner=store.users.create(
        email="o@x", name="o", password_hash="h", now=T0).id, now=T0).id
    for i in range(MAX_SHELL_KEYS + 1):
        user = store.users.create(email=f"m{i}@x", name="m", password_hash="h", now=T0)
        store.teams.add_member(big, user.id, Role.MEMBER)
        store.users.set_cli_key(user.id, f"{i:064x}")
    sync = ShellKeySync(store, ork)
    assert await sync.sync_once() == 1
    assert ork.held(team) == (A, B) and ork.held(big) is None
    assert "app_node.shell_keys_invalid" in caplog.text
