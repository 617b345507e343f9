"""One dialer cannot take all of a target's pairing slots.

Before ``max_pairs_per_dialer_target``, 127 ``pair`` calls from one key filled
the target's ``max_pairs_per_key`` and every other dialer got ``TOO_MANY_PAIRS``
for the pairing timeout, repeatably. The regression tests replay that against
the core and a running relay; the property drives pair/attach/finish/expire/
deliver/reserve sequences from several dialers against a model of the limits.
"""

import itertools
from collections import Counter

import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from p2p.keys import KeyPair
from p2p.relay import RefusalCode, RelayRefused, Role, keep_reservation, request_pair
from relay import PairingPhase, RelayConfig, RelayState, relay_registry
from tests.examples import examples

from ..p2p.helpers import ALICE, BOB, MALLORY
from .helpers import MemoryRelay

TARGET = b"\x01" * 32
FLOODER = b"\x02" * 32
HONEST = [bytes([n]) * 32 for n in range(3, 7)]


def counting_tokens():
    counter = itertools.count(1)
    return lambda n: next(counter).to_bytes(n, "big")


def flood(state: RelayState, dialer: bytes, target: bytes, calls: int, now: float) -> Counter:
    """``calls`` pair requests; return how many succeeded and each refusal code."""
    outcomes: Counter = Counter()
    for _ in range(calls):
        try:
            state.request_pair(dialer, target, now)
        except RelayRefused as exc:
            outcomes[exc.code] += 1
        else:
            outcomes["ok"] += 1
    return outcomes


def test_127_pair_calls_from_one_key_leave_the_target_open_to_other_dialers():
    state = RelayState(RelayConfig(), token_source=counting_tokens())
    reservation, _ = state.reserve(TARGET)
    limit = state.config.max_pairs_per_dialer_target
    assert limit == 8  # the documented default
    outcomes = flood(state, FLOODER, TARGET, 127, now=0.0)
    assert outcomes == {"ok": limit, RefusalCode.TOO_MANY_PAIRS_TO_TARGET: 127 - limit}
    assert state.pairs_between(FLOODER, TARGET) == limit
    assert len(reservation.incoming) == limit
    for dialer in HONEST:
        pairing, _ = state.request_pair(dialer, TARGET, now=1.0)
        assert pairing.initiator == dialer
    assert state.refusals[RefusalCode.TOO_MANY_PAIRS_TO_TARGET] == 127 - limit
    assert state.refusals[RefusalCode.TOO_MANY_PAIRS] == 0
    # Repeating the flood after the timeout changes nothing for the others.
    state.expire(state.config.pair_timeout_s + 1.0)
    reservation.incoming.clear()
    assert flood(state, FLOODER, TARGET, 127, now=20.0)["ok"] == limit
    state.request_pair(HONEST[0], TARGET, now=20.0)


def test_the_route_limit_frees_a_slot_when_one_of_its_pairings_ends():
    state = RelayState(RelayConfig(max_pairs_per_dialer_target=2), token_source=counting_tokens())
    state.reserve(TARGET)
    first, _ = state.request_pair(FLOODER, TARGET, 0.0)
    state.request_pair(FLOODER, TARGET, 0.0)
    flood_result = flood(state, FLOODER, TARGET, 1, 0.0)
    assert flood_result == {RefusalCode.TOO_MANY_PAIRS_TO_TARGET: 1}
    state.attach(first.tokens[Role.INITIATOR], Role.INITIATOR, 0.0)
    state.attach(first.tokens[Role.RESPONDER], Role.RESPONDER, 0.0)
    assert state.pairs_between(FLOODER, TARGET) == 2  # an active pairing still counts
    state.finish(first)
    assert state.pairs_between(FLOODER, TARGET) == 1
    state.request_pair(FLOODER, TARGET, 0.0)


def test_the_dialers_own_limit_comes_before_the_route_limit():
    state = RelayState(RelayConfig(max_pairs_per_key=1, max_pairs_per_dialer_target=1),
                       token_source=counting_tokens())
    state.reserve(TARGET)
    state.request_pair(FLOODER, TARGET, 0.0)
    assert flood(state, FLOODER, TARGET, 1, 0.0) == {RefusalCode.TOO_MANY_PAIRS: 1}


# -- the property -----------------------------------------------------------------

DIALERS = [bytes([0x10 + n]) * 32 for n in range(4)]
TARGETS = [bytes([0x20 + n]) * 32 for n in range(2)]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("pair"), st.sampled_from(DIALERS), st.sampled_from(TARGETS)),
        st.tuples(st.just("attach"), st.integers(0, 50), st.sampled_from(list(Role))),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("tick"), st.floats(0.0, 6.0)),
        st.tuples(st.just("deliver"), st.sampled_from(TARGETS)),
        st.tuples(st.just("reserve"), st.sampled_from(TARGETS)),
    ),
    max_size=80,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    operations,
    st.integers(1, 6),  # max_pairs_per_key
    st.integers(1, 4),  # max_pairs_per_dialer_target
    st.integers(1, 12),  # max_pending_pairs
    st.integers(1, 12),  # max_pairs
)
def test_no_dialer_exceeds_its_route_limit_and_none_is_refused_for_anothers_pairings(
    ops, per_key, per_route, max_pending, max_pairs
):
    config = RelayConfig(max_pairs_per_key=per_key, max_pairs_per_dialer_target=per_route,
                         max_pending_pairs=max_pending, max_pairs=max_pairs,
                         pair_timeout_s=10.0)
    state = RelayState(config, token_source=counting_tokens())
    reservations = {target: state.reserve(target)[0] for target in TARGETS}
    made = []  # every pairing issued, in order (indexes for attach/finish)
    now = 0.0

    def live():
        return [p for p in made if p.phase is not PairingPhase.DONE]

    for op in ops:
        if op[0] == "pair":
            _, dialer, target = op
            current = live()
            by_key = Counter()
            for p in current:
                by_key[p.initiator] += 1
                by_key[p.target] += 1
            route = sum(1 for p in current if (p.initiator, p.target) == (dialer, target))
            pending = sum(1 for p in current if p.phase is not PairingPhase.ACTIVE)
            # The oracle: the first bound that is full names the refusal.
            if by_key[dialer] >= per_key:
                expected = RefusalCode.TOO_MANY_PAIRS
            elif route >= per_route:
                expected = RefusalCode.TOO_MANY_PAIRS_TO_TARGET
            elif (by_key[target] >= per_key
                  or len(reservations[target].incoming) >= per_key
                  or pending >= max_pending or len(current) >= max_pairs):
                expected = RefusalCode.TOO_MANY_PAIRS
            else:
                expected = None  # under every bound: must not be refused
            try:
                pairing, _ = state.request_pair(dialer, target, now)
            except RelayRefused as exc:
                assert exc.code == expected, (exc.code, expected)
            else:
                assert expected is None
                made.append(pairing)
        elif op[0] == "attach":
            _, index, role = op
            if index < len(made):
                try:
                    state.attach(made[index].tokens[role], role, now)
                except RelayRefused:
                    pass
        elif op[0] == "finish":
            if op[1] < len(made):
                state.finish(made[op[1]])
        elif op[0] == "tick":
            now += op[1]
            state.expire(now)
        elif op[0] == "deliver":
            if reservations[op[1]].incoming:
                reservations[op[1]].incoming.popleft()
        elif op[0] == "reserve":
            reservations[op[1]] = state.reserve(op[1])[0]
        for dialer, target in itertools.product(DIALERS, TARGETS):
            assert state.pairs_between(dialer, target) <= per_route
            held = sum(1 for p in live() if (p.initiator, p.target) == (dialer, target))
            assert state.pairs_between(dialer, target) == held
        for key in DIALERS + TARGETS:
            assert state.pairs_of(key) <= per_key


# -- against a running relay --------------------------------------------------------


async def test_a_flooding_dialer_is_refused_on_a_running_relay_and_others_still_pair(
    nursery, autojump_clock
):
    relay = MemoryRelay(nursery)
    await relay.start()
    send, _incoming = trio.open_memory_channel(256)
    with trio.fail_after(60):
        await nursery.start(keep_reservation, await relay.control(BOB), send.send)
        flooder = await relay.control(MALLORY)
        refusals: Counter = Counter()
        for _ in range(127):
            try:
                await request_pair(flooder, BOB.public_key)
            except RelayRefused as exc:
                refusals[exc.code] += 1
        limit = relay.server.config.max_pairs_per_dialer_target
        assert refusals == {RefusalCode.TOO_MANY_PAIRS_TO_TARGET: 127 - limit}
        for dialer in (ALICE, KeyPair.from_seed(b"\x61" * 32), KeyPair.from_seed(b"\x62" * 32)):
            await request_pair(await relay.control(dialer), BOB.public_key)
        assert relay.server.state.pairs_of(BOB.public_key) == limit + 3
    metrics = generate_latest(relay_registry(relay.server)).decode()
    assert (f'blind_relay_refusals_total{{reason="TOO_MANY_PAIRS_TO_TARGET"}} '
            f"{float(127 - limit)}") in metrics
