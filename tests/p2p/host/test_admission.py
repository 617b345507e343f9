"""Admission's pure core: handshake slots, connection slots, source groups, log limits.

Tables for the rules, hypothesis for the invariants over any order of arrivals:
one address (or all of loopback) flooding never takes a configured peer's
handshake slot or connection slot.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.host import ConnectionSlots, HandshakeSlots, address_group
from p2p.host._admission import LogLimiter
from tests.examples import examples

PEER = b"p" * 32


@pytest.mark.parametrize("host, group", [
    ("127.0.0.1", "loopback"),
    ("127.0.0.2", "loopback"),        # a local user may bind any of 127/8
    ("127.255.3.9", "loopback"),
    ("::1", "loopback"),
    ("::ffff:127.0.0.5", "loopback"),  # v4-mapped
    ("::ffff:10.1.2.3", "10.1.2.3"),
    ("10.1.2.3", "10.1.2.3"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),  # same /64: one subscriber
    ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("relay.example", "relay.example"),
    (None, "unknown"),
])
def test_addresses_group_by_who_controls_them(host, group):
    assert address_group(host) == group


# -- handshakes ----------------------------------------------------------------


def test_handshakes_are_admitted_while_there_is_room():
    slots = HandshakeSlots(max_total=4, max_per_group=2)
    decisions = [slots.arrive(group, 0.0) for group in ("a", "a", "b", "c")]
    assert all(d.ticket is not None and d.evict is None for d in decisions)
    assert len(slots) == 4 and slots.count("a") == 2


def test_a_group_at_its_cap_gives_up_its_own_oldest_silent_handshake():
    slots = HandshakeSlots(max_total=10, max_per_group=3)
    first, second, third = (slots.arrive("flood", t).ticket for t in (0.0, 1.0, 2.0))
    slots.progress(first)  # the oldest's message 1 parsed: the oldest *other* one goes
    decision = slots.arrive("flood", 3.0)
    assert decision.evict == second
    assert slots.count("flood") == 3
    assert third is not None


def test_when_every_slot_is_taken_the_group_holding_the_most_gives_one_up():
    slots = HandshakeSlots(max_total=4, max_per_group=4)
    flood = [slots.arrive("flood", t).ticket for t in (0.0, 1.0, 2.0)]
    slots.arrive("other", 0.5)
    decision = slots.arrive("peer", 5.0)
    assert decision.ticket is not None and decision.evict == flood[0]
    assert slots.count("other") == 1 and slots.count("flood") == 2


def test_a_handshake_that_progressed_is_spared_until_the_floor_then_may_go():
    slots = HandshakeSlots(max_total=1, max_per_group=1, grace_s=1.0, min_age_s=0.25)
    speaking = slots.arrive("a", 0.0).ticket
    slots.progress(speaking)
    refused = slots.arrive("a", 0.2)
    assert refused.ticket is None and refused.reason == "busy"
    later = slots.arrive("a", 0.3)  # within the grace, but the only candidate and past the floor
    assert later.ticket is not None and later.evict == speaking


@pytest.mark.parametrize(("progressed", "ages", "victim"), [
    # (which of the group's handshakes parsed message 1, their ages at the newcomer, evicted)
    ((False, False, False), (0.9, 0.5, 0.3), 0),       # none: the oldest
    ((True, False, False), (0.9, 0.5, 0.3), 1),        # the oldest unparsed one
    ((True, True, False), (0.9, 0.5, 0.3), 2),         # a byte-sender past the floor, first
    ((True, True, False), (0.9, 0.5, 0.01), 0),        # a just-arrived one waits for its message 1
    ((True, True, True), (1.5, 0.9, 0.5), 0),          # one past its grace
    ((True, False, True), (0.9, 0.1, 0.5), 0),         # within grace, past the floor: the oldest
    ((True, True, False), (0.2, 0.1, 0.01), 2),        # all young: the unparsed one, not busy
    ((False, False, False), (0.2, 0.1, 0.01), 0),      # all young and unparsed: the oldest
    ((True, True, True), (0.2, 0.1, 0.05), None),      # all parsed and younger than the floor: busy
])
def test_which_handshake_of_a_full_group_gives_way(progressed, ages, victim):
    slots = HandshakeSlots(max_total=10, max_per_group=3, grace_s=1.0, min_age_s=0.25)
    now = 2.0
    tickets = []
    for spoke, age in zip(progressed, ages, strict=True):
        ticket = slots.arrive("flood", now - age).ticket
        if spoke:
            slots.progress(ticket)
        tickets.append(ticket)
    decision = slots.arrive("flood", now)
    if victim is None:
        assert decision.ticket is None and decision.reason == "busy"
    else:
        assert decision.ticket is not None and decision.evict == tickets[victim]


def test_among_unparsed_handshakes_a_silent_one_goes_before_one_that_sent_bytes():
    """A connect flood of silent sockets does not evict a peer whose message 1
    has arrived but is not read yet, however young the flood's sockets are."""
    slots = HandshakeSlots(max_total=10, max_per_group=3, min_age_s=0.25)
    peer = slots.arrive("loopback", 0.0).ticket
    slots.hear(peer)
    silent = [slots.arrive("loopback", t).ticket for t in (0.001, 0.002)]
    assert slots.arrive("loopback", 0.003).evict == silent[0]
    old_silent = slots.arrive("loopback", 1.0)  # all past the floor: still the silent ones first
    assert old_silent.evict == silent[1]


def test_leaving_frees_the_slot_and_is_idempotent():
    slots = HandshakeSlots(max_total=1, max_per_group=1)
    ticket = slots.arrive("a", 0.0).ticket
    slots.leave(ticket)
    slots.leave(ticket)
    assert len(slots) == 0 and slots.count("a") == 0
    assert slots.arrive("b", 0.0).evict is None
    assert not slots.progress(ticket)  # a gone ticket is ignored


@settings(max_examples=examples(200), deadline=None)
@given(
    total=st.integers(1, 12),
    per_group=st.integers(1, 12),
    steps=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "peer"]),
                             st.sampled_from(["arrive", "hear", "speak", "leave"]),
                             st.floats(0, 0.5)), max_size=60),
)
def test_any_arrivals_keep_the_caps_and_spare_every_parsed_handshake_younger_than_the_floor(
        total, per_group, steps):
    """Whatever the order: the caps hold; a handshake whose first message
    parsed is never evicted before ``min_age_s``, nor within its grace while
    its group has one that goes first (unparsed for the floor, or past its
    grace); a newcomer is refused only when every candidate parsed and is
    younger than the floor."""
    grace, floor = 1.0, 0.25
    slots = HandshakeSlots(max_total=total, max_per_group=per_group, grace_s=grace,
                           min_age_s=floor)
    now = 0.0
    live: dict[int, tuple[str, float, bool]] = {}  # ticket -> (group, started, parsed)

    def age(ticket: int) -> float:
        return now - live[ticket][1]

    def parsed(ticket: int) -> bool:
        return live[ticket][2]

    for group, action, pause in steps:
        now += pause
        mine = [t for t, (g, _, _) in live.items() if g == group]
        if action == "arrive":
            pool = mine if len(mine) >= min(per_group, total) else list(live)
            decision = slots.arrive(group, now)
            if decision.ticket is None:
                assert pool and all(parsed(t) and age(t) < floor for t in pool)
                continue
            if decision.evict is not None:
                victim = decision.evict
                assert victim in pool
                assert not (parsed(victim) and age(victim) < floor)
                if parsed(victim) and age(victim) < grace:
                    same = [t for t in pool if live[t][0] == live[victim][0]]
                    assert not any((not parsed(t) and age(t) >= floor)
                                   or (parsed(t) and age(t) >= grace) for t in same)
                live.pop(victim)
            live[decision.ticket] = (group, now, False)
        elif mine and action == "hear":
            slots.hear(mine[-1])  # bytes, not (yet) a message: no progress
        elif mine and action == "speak":
            slots.progress(mine[0])
            g, started, _ = live[mine[0]]
            live[mine[0]] = (g, started, True)
        elif mine and action == "leave":
            slots.leave(mine[-1])
            del live[mine[-1]]
        assert len(slots) == len(live) <= total
        for g in ("a", "b", "c", "peer"):
            assert slots.count(g) == sum(1 for x, _, _ in live.values() if x == g) <= per_group


@settings(max_examples=examples(100), deadline=None)
@given(flood=st.lists(st.sampled_from(["loopback", "10.0.0.1"]), min_size=1, max_size=300),
       at=st.integers(0, 299), peer_group=st.sampled_from(["loopback", "10.0.0.9"]),
       parses=st.booleans(), rate=st.sampled_from([60.0, 200.0, 1000.0]))
def test_a_peer_keeps_its_handshake_for_the_floor_under_any_flood(
        flood, at, peer_group, parses, rate):
    """A stranger opens sockets at ``rate``/s, from the peer's own address or
    another, silent or sending a message 1 that parses (his is as valid as a
    peer's); the peer, whose message 1 parses as soon as it is accepted, is
    never evicted before ``min_age_s`` (its handshake's remaining round trip
    takes milliseconds)."""
    floor = 0.25
    slots = HandshakeSlots(max_total=64, max_per_group=16, grace_s=1.0, min_age_s=floor)
    now, peer, peer_at = 0.0, None, 0.0
    for index, group in enumerate(flood):
        now += 1 / rate
        if index == at:
            decision = slots.arrive(peer_group, now)
            if decision.ticket is not None:
                peer, peer_at = decision.ticket, now
                slots.hear(peer)  # its message 1 follows the connect...
        decision = slots.arrive(group, now)
        if not parses:
            assert decision.ticket is not None  # unparsed handshakes are always evictable
            assert peer is None or decision.evict != peer  # silent ones go first
        if peer is not None and index == at:
            slots.progress(peer)  # ...and is read and parsed a moment later
        if decision.ticket is not None and parses:
            slots.progress(decision.ticket)
        if peer is not None and decision.evict == peer:
            assert now - peer_at >= floor
            peer = None  # it had its floor; a real one would be done


def test_a_flood_of_parsing_first_messages_leaves_room_for_a_peer_each_floor():
    """At 60/s from one source (all of loopback), with every flood handshake's
    message 1 parsing, a newcomer finds room: the source's 16 slots turn over
    every 16/60 s, never faster than the floor."""
    slots = HandshakeSlots(max_total=64, max_per_group=16, grace_s=1.0, min_age_s=0.25)
    admitted = refused = 0
    for n in range(600):  # ten seconds
        decision = slots.arrive("loopback", n / 60)
        if decision.ticket is None:
            refused += 1
            continue
        admitted += 1
        slots.progress(decision.ticket)
    assert refused == 0 and admitted == 600


# -- connections -----------------------------------------------------------------


def key(n: int) -> bytes:
    return n.to_bytes(32, "big")


def test_strangers_take_only_what_the_reserve_leaves():
    slots = ConnectionSlots(max_total=4, reserve=2)
    for n in range(2):
        assert slots.decide(key(n), f"10.0.0.{n}", reserved=False, now=5).ok
        slots.take(n, key(n), f"10.0.0.{n}", reserved=False, now=n)
    refused = slots.decide(key(9), "10.0.0.9", reserved=False, now=5)
    assert not refused.ok and refused.reason == "full"
    for n in (10, 11):
        decision = slots.decide(key(n), "loopback", reserved=True, now=5)
        assert decision.ok and decision.evict is None
        slots.take(n, key(n), "loopback", reserved=True, now=n)
    assert len(slots) == 4 and slots.strangers == 2


def test_a_reserved_peer_finding_every_slot_taken_evicts_the_newest_stranger_of_the_biggest_group():
    slots = ConnectionSlots(max_total=4, reserve=0)
    for n, group in enumerate(["flood", "flood", "other", "flood"]):
        slots.take(n, key(n), group, reserved=False, now=float(n))
    decision = slots.decide(PEER, "loopback", reserved=True, now=5)
    assert decision.ok and decision.evict == 3
    assert not slots.decide(key(7), "x", reserved=False, now=5).ok


def test_with_only_reserved_peers_holding_every_slot_a_reserved_newcomer_is_refused():
    slots = ConnectionSlots(max_total=2, reserve=1)
    for n in range(2):
        slots.take(n, key(n), "loopback", reserved=True, now=n)
    decision = slots.decide(PEER, "loopback", reserved=True, now=99)
    assert not decision.ok and decision.reason == "full"


@pytest.mark.parametrize("held, newcomer_group, newcomer_key, reason", [
    ([("10.0.0.1", 1), ("10.0.0.1", 2)], "10.0.0.1", 3, "address_full"),
    ([("10.0.0.1", 1), ("10.0.0.1", 2)], "10.0.0.2", 3, ""),
    ([("10.0.0.1", 1), ("10.0.0.2", 1)], "10.0.0.3", 1, "key_full"),
    ([("unknown", 1), ("unknown", 2)], "unknown", 3, ""),  # no address: no per-address cap
])
def test_strangers_are_capped_per_address_and_per_key(held, newcomer_group, newcomer_key, reason):
    slots = ConnectionSlots(max_total=10, reserve=2, max_per_group=2, max_per_key=2)
    for handle, (group, n) in enumerate(held):
        slots.take(handle, key(n), group, reserved=False, now=handle)
    decision = slots.decide(key(newcomer_key), newcomer_group, reserved=False, now=5)
    assert decision.ok == (not reason) and decision.reason == reason


def test_reserved_peers_do_not_count_against_an_address():
    slots = ConnectionSlots(max_total=10, reserve=2, max_per_group=1)
    slots.take("worker", key(1), "loopback", reserved=True, now=0)
    assert slots.decide(key(2), "loopback", reserved=False, now=0).ok


def test_a_stranger_holding_on_gives_way_to_a_newcomer_after_a_while():
    """The strangers' slots are full of one client's connections: a newcomer
    (a new job's agent before its hello) is refused while they are fresh,
    then evicts the oldest one; of its own address if that is the limit."""
    slots = ConnectionSlots(max_total=6, reserve=2, max_per_group=3, evict_after_s=10)
    for n in range(3):
        slots.take(n, key(n), "loopback", reserved=False, now=float(n))
    assert slots.decide(PEER, "loopback", reserved=False, now=5).reason == "address_full"
    decision = slots.decide(PEER, "loopback", reserved=False, now=10.5)
    assert decision.ok and decision.evict == 0
    slots.release(0)
    slots.take("agent", PEER, "loopback", reserved=False, now=10.5)
    slots.take(3, key(3), "10.0.0.1", reserved=False, now=10.6)
    full = slots.decide(key(4), "10.0.0.2", reserved=False, now=10.9)
    assert not full.ok and full.reason == "full"  # 4 strangers: 6 - 2 reserved
    assert slots.decide(key(4), "10.0.0.2", reserved=False, now=11).evict == 1


def test_an_idle_stranger_is_evicted_before_one_that_asked_for_something():
    """One client holds slots without asking anything, dialling again the
    moment it is evicted; a new agent has sent its hello (busy) and waits for
    the answer on a loaded machine. A newcomer evicts the client's oldest
    idle connection at any age (no race to the moment a slot comes of age),
    never the agent; with only busy strangers, the oldest goes once
    ``evict_after_s`` old, as without activity to go by."""
    slots = ConnectionSlots(max_total=6, reserve=2, max_per_group=3, evict_after_s=1)
    slots.take("agent", PEER, "loopback", reserved=False, now=0)
    slots.take(1, key(1), "loopback", reserved=False, now=0.5)
    slots.take(2, key(2), "loopback", reserved=False, now=0.6)
    busy = {"agent"}.__contains__
    assert slots.decide(key(3), "loopback", reserved=False, now=0.6, busy=busy).evict == 1
    assert slots.decide(key(3), "loopback", reserved=False, now=9, busy=busy).evict == 1
    assert not slots.decide(key(3), "loopback", reserved=False, now=0.6).ok  # all busy, fresh
    assert slots.decide(key(3), "loopback", reserved=False, now=9).evict == "agent"
    everyone = {"agent", 1, 2}.__contains__
    assert slots.decide(key(3), "loopback", reserved=False, now=9,
                        busy=everyone).evict == "agent"


def test_a_reserved_peer_evicts_an_idle_stranger_before_the_newest_busy_one():
    slots = ConnectionSlots(max_total=2, reserve=0)
    slots.take("holder", key(1), "loopback", reserved=False, now=0)
    slots.take("agent", key(2), "loopback", reserved=False, now=1)
    assert slots.decide(PEER, "loopback", reserved=True, now=2).evict == "agent"
    assert slots.decide(PEER, "loopback", reserved=True, now=2,
                        busy={"agent"}.__contains__).evict == "holder"


def test_a_stranger_promoted_to_reserved_frees_the_strangers_slots():
    slots = ConnectionSlots(max_total=3, reserve=1, max_per_group=2)
    slots.take("agent", key(1), "loopback", reserved=False, now=0)
    slots.take("other", key(2), "loopback", reserved=False, now=0)
    assert slots.decide(key(3), "10.0.0.1", reserved=False, now=1).reason == "full"
    slots.promote("agent")  # its hello bound its key
    slots.promote("agent")  # idempotent
    assert slots.strangers == 1 and [h for h, _ in slots.strangers_held()] == ["other"]
    assert slots.decide(key(3), "10.0.0.1", reserved=False, now=1).ok
    slots.release("agent")
    assert len(slots) == 1 and slots.strangers == 1


@settings(max_examples=examples(200), deadline=None)
@given(reserve=st.integers(0, 7), steps=st.lists(
    st.tuples(st.sampled_from(["stranger", "peer", "close"]), st.sampled_from(["a", "b"]),
              st.integers(0, 20)), max_size=60))
def test_no_stranger_ever_holds_the_reserve_and_peers_always_get_in(reserve, steps):
    total = 8
    slots = ConnectionSlots(max_total=total, reserve=reserve, max_per_group=5, evict_after_s=3)
    held: dict[int, bool] = {}  # handle -> reserved
    since: dict[int, float] = {}
    for handle, (who, group, n) in enumerate(steps):
        now = float(handle)
        if who == "close":
            if held:
                victim = sorted(held)[n % len(held)]
                slots.release(victim)
                del held[victim]
            continue
        reserved = who == "peer"
        decision = slots.decide(key(handle), group, reserved=reserved, now=now)
        if reserved and sum(held.values()) < total:
            assert decision.ok  # a stranger is evicted if need be
        if decision.ok:
            if decision.evict is not None:
                assert held.pop(decision.evict) is False  # only strangers give way
                # to another stranger, only after holding on for evict_after_s
                assert reserved or now - since[decision.evict] >= 3
                slots.release(decision.evict)
            slots.take(handle, key(handle), group, reserved=reserved, now=now)
            held[handle] = reserved
            since[handle] = now
        assert len(slots) == len(held) <= total
        assert slots.strangers == sum(not r for r in held.values()) <= total - reserve


def test_log_lines_of_one_reason_are_held_back_and_counted():
    limiter = LogLimiter(interval_s=10)
    assert limiter.admit("busy", 0.0) == 0
    assert limiter.admit("busy", 1.0) is None
    assert limiter.admit("evicted", 1.0) == 0  # another reason logs at once
    assert limiter.admit("busy", 2.0) is None
    assert limiter.admit("busy", 10.5) == 2
