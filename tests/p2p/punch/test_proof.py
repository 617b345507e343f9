"""Proving a new path belongs to a session (p2p.punch._proof and prove_path): both
roles over in-memory streams, strangers, replays, role confusion, and fuzzed bytes."""

import os

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from p2p.punch import PathProofError, prove_path
from p2p.punch._proof import (
    HELLO_BYTES,
    PROOF_BYTES,
    check_proof,
    make_hello,
    make_proof,
    parse_hello,
    path_id,
)

from ..helpers import secret_stream_pair

SECRET = os.urandom(32)


async def _prove_both(left_session, right_session, left_raw=None, right_raw=None):
    if left_raw is None:
        left_raw, right_raw = trio.testing.memory_stream_pair()
    results: dict[str, object] = {}

    async def one(name, raw, session):
        try:
            results[name] = await prove_path(raw, session, timeout_s=5)
        except PathProofError as exc:
            results[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "left", left_raw, left_session)
        nursery.start_soon(one, "right", right_raw, right_session)
    return results["left"], results["right"]


async def test_both_ends_of_a_session_prove_a_path_and_name_it_alike():
    initiator, responder = await secret_stream_pair()
    left, right = await _prove_both(initiator, responder)
    assert isinstance(left, bytes) and left == right and len(left) == 16


async def test_each_path_gets_a_fresh_id():
    initiator, responder = await secret_stream_pair()
    first = await _prove_both(initiator, responder)
    second = await _prove_both(initiator, responder)
    assert first[0] != second[0]


async def test_a_stranger_with_a_session_of_its_own_proves_nothing():
    initiator, _ = await secret_stream_pair()
    _, strangers_responder = await secret_stream_pair()
    left, right = await _prove_both(initiator, strangers_responder)
    assert isinstance(left, PathProofError) and isinstance(right, PathProofError)
    assert "another session" in str(left)


async def test_two_initiators_of_one_session_refuse_each_other():
    initiator, _ = await secret_stream_pair()
    left, right = await _prove_both(initiator, initiator)
    assert isinstance(left, PathProofError) and "role" in str(left)
    assert isinstance(right, PathProofError)


class _Recording(trio.abc.Stream):
    """A stream that keeps a copy of what is sent on it (an on-path observer)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner, self.sent = inner, bytearray()

    async def send_all(self, data) -> None:
        self.sent += data
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_replayed_answer_does_not_prove_a_new_path(autojump_clock):
    """An observer replays what the responder sent on an earlier path: the
    initiator's fresh nonce makes the old proof worthless."""
    initiator, responder = await secret_stream_pair()
    left_raw, right_raw = trio.testing.memory_stream_pair()
    observed = _Recording(right_raw)
    left, right = await _prove_both(initiator, responder, left_raw, observed)
    assert left == right
    assert len(observed.sent) == HELLO_BYTES + PROOF_BYTES
    attacker, victim = trio.testing.memory_stream_pair()

    async def replay() -> None:
        await attacker.receive_some(HELLO_BYTES)
        await attacker.send_all(bytes(observed.sent))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(replay)
        with pytest.raises(PathProofError, match="does not verify"):
            await prove_path(victim, initiator, timeout_s=5)


async def test_a_silent_path_times_out(autojump_clock):
    initiator, _ = await secret_stream_pair()
    raw, _other = trio.testing.memory_stream_pair()
    with pytest.raises(PathProofError, match="no proof within 2"):
        await prove_path(raw, initiator, timeout_s=2)


async def test_a_path_that_closes_mid_proof_fails_cleanly():
    initiator, _ = await secret_stream_pair()
    raw, other = trio.testing.memory_stream_pair()
    await other.aclose()
    with pytest.raises(PathProofError):
        await prove_path(raw, initiator, timeout_s=2)


def test_the_proof_covers_role_nonces_and_session():
    mine, theirs = os.urandom(16), os.urandom(16)
    proof = make_proof(SECRET, b"R", theirs, mine)
    check_proof(proof, SECRET, peer_role=b"R", peer_nonce=theirs, own_nonce=mine)
    for secret, role, peer_nonce, own_nonce in (
            (os.urandom(32), b"R", theirs, mine), (SECRET, b"I", theirs, mine),
            (SECRET, b"R", mine, theirs), (SECRET, b"R", theirs, os.urandom(16))):
        with pytest.raises(PathProofError):
            check_proof(proof, secret, peer_role=role, peer_nonce=peer_nonce,
                        own_nonce=own_nonce)
    assert path_id(mine, theirs) != path_id(theirs, mine)


@given(st.binary(max_size=2 * HELLO_BYTES))
def test_any_bytes_as_a_hello_are_refused_or_parsed_never_crash(data):
    try:
        nonce = parse_hello(data, SECRET, peer_role=b"I")
    except PathProofError:
        return
    assert data == make_hello(SECRET, b"I", nonce)


@given(st.binary(max_size=64))
def test_any_bytes_as_a_proof_are_refused(data):
    with pytest.raises(PathProofError):
        check_proof(data, SECRET, peer_role=b"I", peer_nonce=bytes(16), own_nonce=bytes(16))
