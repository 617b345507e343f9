"""The sans-IO pairing core: reservations, pairings, limits and expiry, without trio."""

import itertools

import pytest

from p2p.errors import LocalProtocolError
from p2p.relay import RefusalCode, RelayRefused, Role
from relay import PairingPhase, RelayConfig, RelayState

A, B, C, D = (bytes([n]) * 32 for n in range(1, 5))


def counting_tokens():
    counter = itertools.count(1)
    return lambda n: next(counter).to_bytes(n, "big")


def make_state(**config) -> RelayState:
    return RelayState(RelayConfig(**config), token_source=counting_tokens())


def refused(code, fn, *args):
    with pytest.raises(RelayRefused) as info:
        fn(*args)
    assert info.value.code == code
    return info.value


def test_pair_queues_the_responder_token_on_the_target_reservation_and_not_the_dialers():
    state = make_state()
    reservation, replaced = state.reserve(B)
    assert replaced is None
    pairing, got = state.request_pair(A, B, now=0.0)
    assert got is reservation
    initiator_token = pairing.tokens[Role.INITIATOR]
    responder_token = pairing.tokens[Role.RESPONDER]
    assert initiator_token != responder_token
    assert list(reservation.incoming) == [(responder_token, A)]
    assert pairing.phase is PairingPhase.WAITING


def test_both_attaches_make_the_pairing_active_and_burn_both_tokens():
    state = make_state()
    state.reserve(B)
    pairing, _ = state.request_pair(A, B, now=0.0)
    assert state.attach(pairing.tokens[Role.RESPONDER], Role.RESPONDER, 1.0) is pairing
    assert pairing.phase is PairingPhase.HALF_ATTACHED
    assert state.attach(pairing.tokens[Role.INITIATOR], Role.INITIATOR, 1.0) is pairing
    assert pairing.phase is PairingPhase.ACTIVE
    stats = state.statistics()
    assert (stats.pending_pairs, stats.active_pairs, stats.pairs_made) == (0, 1, 1)
    for role, token in pairing.tokens.items():
        refused(RefusalCode.UNKNOWN_TOKEN, state.attach, token, role, 2.0)
    assert state.next_deadline() is None


def test_a_token_presented_for_the_other_role_is_refused_and_leaves_the_pairing_waiting():
    state = make_state()
    state.reserve(B)
    pairing, _ = state.request_pair(A, B, now=0.0)
    refused(RefusalCode.WRONG_ROLE, state.attach, pairing.tokens[Role.INITIATOR],
            Role.RESPONDER, 0.5)
    refused(RefusalCode.WRONG_ROLE, state.attach, pairing.tokens[Role.RESPONDER],
            Role.INITIATOR, 0.5)
    assert pairing.phase is PairingPhase.WAITING
    assert state.refusals[RefusalCode.WRONG_ROLE] == 2


def test_a_second_attach_of_the_same_role_is_refused():
    state = make_state()
    state.reserve(B)
    pairing, _ = state.request_pair(A, B, now=0.0)
    token = pairing.tokens[Role.INITIATOR]
    state.attach(token, Role.INITIATOR, 0.1)
    refused(RefusalCode.ALREADY_ATTACHED, state.attach, token, Role.INITIATOR, 0.2)


def test_an_invented_token_is_unknown():
    state = make_state()
    refused(RefusalCode.UNKNOWN_TOKEN, state.attach, b"\x99" * 32, Role.INITIATOR, 0.0)


def test_expiry_drops_waiting_pairings_in_order_and_frees_their_slots():
    state = make_state(pair_timeout_s=10.0, max_pairs_per_key=2)
    reservation, _ = state.reserve(B)
    first, _ = state.request_pair(A, B, now=0.0)
    second, _ = state.request_pair(A, B, now=4.0)
    reservation.incoming.clear()  # the holder read its items
    refused(RefusalCode.TOO_MANY_PAIRS, state.request_pair, A, B, 5.0)
    assert state.next_deadline() == 10.0
    assert state.expire(9.999) == []
    # An attach at the deadline is too late even before the sweep ran.
    refused(RefusalCode.UNKNOWN_TOKEN, state.attach, first.tokens[Role.INITIATOR],
            Role.INITIATOR, 10.0)
    assert state.expire(10.0) == [first]
    assert first.phase is PairingPhase.DONE
    assert state.next_deadline() == 14.0
    assert state.pairs_of(A) == 1
    third, _ = state.request_pair(A, B, now=10.0)  # the slot is free again
    assert state.expire(100.0) == [second, third]
    assert state.statistics().pending_pairs == 0
    assert state.pairs_of(A) == 0 and state.pairs_of(B) == 0
    assert state.refusals[RefusalCode.PAIR_TIMEOUT] == 3


def test_a_half_attached_pairing_expires_too():
    state = make_state(pair_timeout_s=1.0)
    state.reserve(B)
    pairing, _ = state.request_pair(A, B, now=0.0)
    state.attach(pairing.tokens[Role.RESPONDER], Role.RESPONDER, 0.5)
    assert state.expire(1.0) == [pairing]
    refused(RefusalCode.UNKNOWN_TOKEN, state.attach, pairing.tokens[Role.INITIATOR],
            Role.INITIATOR, 1.0)


def test_finish_frees_the_per_key_and_relay_wide_slots():
    state = make_state(max_pairs_per_key=1, max_pairs=1)
    state.reserve(B)
    state.reserve(D)
    pairing, _ = state.request_pair(A, B, now=0.0)
    state.attach(pairing.tokens[Role.INITIATOR], Role.INITIATOR, 0.0)
    state.attach(pairing.tokens[Role.RESPONDER], Role.RESPONDER, 0.0)
    refused(RefusalCode.TOO_MANY_PAIRS, state.request_pair, A, B, 0.0)  # per key
    refused(RefusalCode.TOO_MANY_PAIRS, state.request_pair, C, D, 0.0)  # relay-wide
    state.finish(pairing)
    state.finish(pairing)  # twice is harmless
    assert state.statistics().active_pairs == 0
    state.request_pair(C, D, now=1.0)


def test_pending_pairings_are_bounded_relay_wide():
    state = make_state(max_pending_pairs=2)
    state.reserve(B)
    state.request_pair(A, B, now=0.0)
    state.request_pair(C, B, now=0.0)
    refused(RefusalCode.TOO_MANY_PAIRS, state.request_pair, D, B, 0.0)


def test_a_target_without_reservation_and_self_pairing_are_refused():
    state = make_state()
    error = refused(RefusalCode.NOT_RESERVED, state.request_pair, A, B, 0.0)
    assert "no reservation" in error.message
    state.reserve(A)
    refused(RefusalCode.SELF_PAIR, state.request_pair, A, A, 0.0)


def test_the_allow_list_admits_only_listed_keys():
    state = make_state(allow=frozenset({B}))
    refused(RefusalCode.NOT_ALLOWED, state.reserve, A)
    state.reserve(B)
    assert state.statistics().reservations == 1


def test_reservations_are_bounded_but_a_holder_may_replace_its_own():
    state = make_state(max_reservations=1)
    first, _ = state.reserve(A)
    refused(RefusalCode.TOO_MANY_RESERVATIONS, state.reserve, B)
    second, replaced = state.reserve(A)
    assert replaced is first and first.replaced and not second.replaced
    state.end_reservation(first)  # the old stream ending does not drop the new one
    assert state.reservation_for(A) is second
    state.end_reservation(second)
    assert state.reservation_for(A) is None
    state.reserve(B)


def test_undelivered_items_move_to_the_replacing_reservation():
    state = make_state()
    old, _ = state.reserve(B)
    pairing, _ = state.request_pair(A, B, now=0.0)
    new, _ = state.reserve(B)
    assert list(new.incoming) == [(pairing.tokens[Role.RESPONDER], A)]
    assert not old.incoming


def test_undelivered_items_are_bounded_per_reservation():
    state = make_state(max_pairs_per_key=2)
    reservation, _ = state.reserve(B)
    state.request_pair(A, B, now=0.0)
    state.request_pair(C, B, now=0.0)
    state.expire(100.0)  # the pairings are gone, the items were never read
    assert len(reservation.incoming) == 2
    refused(RefusalCode.TOO_MANY_PAIRS, state.request_pair, D, B, 100.0)


def test_config_is_validated_when_built():
    for bad in ({"max_reservations": 0}, {"pair_timeout_s": 0}, {"min_chunk_bytes": 10**9},
                {"allow": frozenset({b"short"})}, {"max_pairs": True}):
        with pytest.raises(LocalProtocolError):
            RelayConfig(**bad)
    assert RelayConfig(allow={A}).allow == frozenset({A})


def test_chunk_size_shrinks_as_pairs_share_the_buffer_budget():
    config = RelayConfig(buffer_budget_bytes=64 << 20, max_chunk_bytes=256 << 10,
                         min_chunk_bytes=16 << 10)
    assert config.chunk_bytes(0) == config.chunk_bytes(1) == 256 << 10
    assert config.chunk_bytes(128) == 256 << 10
    assert config.chunk_bytes(1000) == (64 << 20) // 2000
    assert config.chunk_bytes(100_000) == 16 << 10


# Every (pairing state, attach) pair: how the core answers.
I, R = Role.INITIATOR, Role.RESPONDER  # noqa: E741 - the roles, as in the tables
STATES = {
    "waiting": [],
    "initiator attached": [(I, I)],
    "responder attached": [(R, R)],
    "active": [(I, I), (R, R)],
}
#: (token of role, presented as role) -> expected answer per state
EXPECTED = {
    (I, I): {"waiting": "ok", "initiator attached": RefusalCode.ALREADY_ATTACHED,
             "responder attached": "ok", "active": RefusalCode.UNKNOWN_TOKEN},
    (R, R): {"waiting": "ok", "initiator attached": "ok",
             "responder attached": RefusalCode.ALREADY_ATTACHED,
             "active": RefusalCode.UNKNOWN_TOKEN},
    (I, R): {"waiting": RefusalCode.WRONG_ROLE, "initiator attached": RefusalCode.WRONG_ROLE,
             "responder attached": RefusalCode.WRONG_ROLE, "active": RefusalCode.UNKNOWN_TOKEN},
    (R, I): {"waiting": RefusalCode.WRONG_ROLE, "initiator attached": RefusalCode.WRONG_ROLE,
             "responder attached": RefusalCode.WRONG_ROLE, "active": RefusalCode.UNKNOWN_TOKEN},
}


@pytest.mark.parametrize("state_name", list(STATES))
@pytest.mark.parametrize("attach", list(EXPECTED))
@pytest.mark.parametrize("late", [False, True])
def test_every_attach_in_every_pairing_state(state_name, attach, late):
    state = make_state(pair_timeout_s=10.0)
    state.reserve(B)
    pairing, _ = state.request_pair(A, B, now=0.0)
    for token_role, as_role in STATES[state_name]:
        state.attach(pairing.tokens[token_role], as_role, 1.0)
    token_role, as_role = attach
    expected = EXPECTED[attach][state_name]
    if late:  # past the pairing timeout every token is dead, swept or not
        expected = RefusalCode.UNKNOWN_TOKEN
    now = 10.0 if late else 2.0
    if expected == "ok":
        phase_before = pairing.phase
        assert state.attach(pairing.tokens[token_role], as_role, now) is pairing
        assert pairing.phase is (PairingPhase.ACTIVE if phase_before is
                                 PairingPhase.HALF_ATTACHED else PairingPhase.HALF_ATTACHED)
    else:
        phase_before = pairing.phase
        refused(expected, state.attach, pairing.tokens[token_role], as_role, now)
        assert pairing.phase is phase_before  # a refusal changes nothing
