"""The sans-IO handshake and transport, driven by piping bytes between two cores."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.errors import HandshakeError, LocalProtocolError, RemoteProtocolError
from p2p.keys import KeyPair
from p2p.noise import NEED_DATA, Data, EndOfStream, Handshake, KeepAlive, Transport
from p2p.noise._handshake import PROOF_CONTEXT
from p2p.noise._transport import MAX_PLAINTEXT_BYTES
from p2p.noise._wire import FrameType, pack_header
from tests.examples import examples

ALICE = KeyPair.from_seed(bytes(range(32)))
BOB = KeyPair.from_seed(bytes(range(1, 33)))
MALLORY = KeyPair.from_seed(bytes(range(2, 34)))


def handshake_messages(initiator_key=ALICE, responder_key=BOB, expected=BOB.public_key):
    initiator = Handshake(initiator_key, initiator=True, expected_remote_key=expected)
    responder = Handshake(responder_key, initiator=False)
    m1 = initiator.initiate()
    m2 = responder.receive_data(m1)
    m3 = initiator.receive_data(m2)
    return initiator, responder, (m1, m2, m3)


def transports():
    initiator, responder, (_, _, m3) = handshake_messages()
    assert responder.receive_data(m3) == b""
    return initiator.transport(), responder.transport()


def drain(transport):
    events = []
    while (event := transport.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def test_handshake_agrees_on_keys_and_hash():
    initiator, responder, (_, _, m3) = handshake_messages()
    responder.receive_data(m3)
    assert initiator.complete and responder.complete
    assert initiator.remote_public_key == BOB.public_key
    assert responder.remote_public_key == ALICE.public_key
    assert initiator.handshake_hash == responder.handshake_hash
    assert len(initiator.handshake_hash) == 64


def test_handshake_fed_one_byte_at_a_time_completes():
    initiator = Handshake(ALICE, initiator=True, expected_remote_key=BOB.public_key)
    responder = Handshake(BOB, initiator=False)

    def trickle(core, data):
        return b"".join(core.receive_data(data[i : i + 1]) for i in range(len(data)))

    m2 = trickle(responder, initiator.initiate())
    m3 = trickle(initiator, m2)
    assert trickle(responder, m3) == b""
    assert initiator.complete and responder.complete
    assert initiator.handshake_hash == responder.handshake_hash


def test_key_mismatch_names_both_keys_and_hides_the_initiator():
    initiator = Handshake(ALICE, initiator=True, expected_remote_key=MALLORY.public_key)
    responder = Handshake(BOB, initiator=False)
    m2 = responder.receive_data(initiator.initiate())
    with pytest.raises(HandshakeError) as info:
        initiator.receive_data(m2)
    error = info.value
    assert error.code == "KEY_MISMATCH"
    assert error.expected == MALLORY.public_key and error.actual == BOB.public_key
    assert MALLORY.hex in str(error) and BOB.hex in str(error)
    # The initiator produced no message 3: the responder never learns who dialed.
    assert responder.remote_public_key is None
    with pytest.raises(HandshakeError, match="already failed"):
        initiator.receive_data(b"")


def test_initiator_without_expected_key_accepts_any_responder():
    initiator, responder, (_, _, m3) = handshake_messages(expected=None)
    responder.receive_data(m3)
    assert initiator.remote_public_key == BOB.public_key


def test_different_prologues_cannot_complete_a_handshake():
    initiator = Handshake(ALICE, initiator=True, prologue=b"other/1")
    responder = Handshake(BOB, initiator=False)
    m2 = responder.receive_data(initiator.initiate())
    with pytest.raises(HandshakeError) as info:
        initiator.receive_data(m2)
    assert info.value.code == "BAD_MESSAGE"


class ClaimsAnotherKey(Handshake):
    """A responder that holds BOB's Noise key but claims MALLORY's identity."""

    def _identity_payload(self, h, *, role):
        return bytes([1]) + MALLORY.public_key + MALLORY.sign(PROOF_CONTEXT + role + h)


class SignsTheWrongHash(Handshake):
    """A responder whose proof was made for another handshake (a replay)."""

    def _identity_payload(self, h, *, role):
        return bytes([1]) + self.keypair.public_key + self.keypair.sign(PROOF_CONTEXT + role + b"x")


@pytest.mark.parametrize("responder_class", [ClaimsAnotherKey, SignsTheWrongHash])
def test_forged_identity_proofs_are_refused(responder_class):
    initiator = Handshake(ALICE, initiator=True, expected_remote_key=None)
    responder = responder_class(BOB, initiator=False)
    m2 = responder.receive_data(initiator.initiate())
    with pytest.raises(HandshakeError) as info:
        initiator.receive_data(m2)
    assert info.value.code == "BAD_PROOF"


def test_tampered_final_message_fails_on_the_responder():
    _, responder, (_, _, m3) = handshake_messages()
    tampered = bytearray(m3)
    tampered[-5] ^= 0x01
    with pytest.raises(HandshakeError) as info:
        responder.receive_data(bytes(tampered))
    assert info.value.code == "BAD_MESSAGE"


@pytest.mark.parametrize(
    "frame",
    [
        pack_header(10, FrameType.DATA) + bytes(10),
        pack_header(5000, FrameType.HANDSHAKE),
        pack_header(3, FrameType.HANDSHAKE) + b"abc",
    ],
)
def test_responder_refuses_frames_that_are_not_handshake_messages(frame):
    with pytest.raises(HandshakeError) as info:
        Handshake(BOB, initiator=False).receive_data(frame)
    assert info.value.code == "BAD_MESSAGE"


def test_data_pipelined_after_the_final_message_reaches_the_transport():
    initiator, responder, (_, _, m3) = handshake_messages()
    sender = initiator.transport()
    responder.receive_data(m3 + sender.send_data(b"early bird"))
    assert drain(responder.transport()) == [Data(b"early bird")]


@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_raise_handshake_error(data):
    responder = Handshake(BOB, initiator=False)
    try:
        responder.receive_data(data)
    except HandshakeError:
        pass


@settings(max_examples=examples(200))
@given(st.integers(0, 2), st.integers(0, 10_000), st.integers(1, 255))
def test_mutated_handshake_messages_only_raise_handshake_error(which, position, flip):
    initiator, responder, messages = handshake_messages()
    message = bytearray(messages[which])
    message[position % len(message)] ^= flip
    target = responder if which != 1 else initiator
    fresh = Handshake(BOB, initiator=False) if which == 0 else target
    try:
        fresh.receive_data(bytes(message))
    except HandshakeError:
        pass


# -- transport ---------------------------------------------------------------


@given(st.lists(st.binary(max_size=3 * MAX_PLAINTEXT_BYTES), max_size=4))
@settings(max_examples=examples(30), deadline=None)
def test_transport_round_trips_any_writes_in_order(chunks):
    sender, receiver = transports()
    receiver.receive_data(b"".join(sender.send_data(c) for c in chunks))
    received = b"".join(e.data for e in drain(receiver) if isinstance(e, Data))
    assert received == b"".join(chunks)


def test_large_writes_are_split_into_noise_sized_frames_and_rejoined():
    sender, receiver = transports()
    payload = bytes(range(256)) * (2 * MAX_PLAINTEXT_BYTES // 256 + 1)
    frames = sender.send_data(payload)
    assert sender.frames_sent == 3
    assert len(frames) == len(payload) + 3 * (4 + 16)
    receiver.receive_data(frames)
    assert drain(receiver) == [Data(payload)]
    assert receiver.frames_received == 3


def test_frames_before_a_bad_one_are_delivered_then_the_error():
    sender, receiver = transports()
    good = sender.send_data(b"good")
    bad = bytearray(sender.send_data(b"bad!"))
    bad[-1] ^= 1
    receiver.receive_data(bytes(good) + bytes(bad))
    assert receiver.next_event() == Data(b"good")
    with pytest.raises(RemoteProtocolError) as info:
        receiver.next_event()
    assert info.value.code == "DECRYPT_FAILED"


def test_keepalive_and_end_are_events_and_nothing_may_follow_end():
    sender, receiver = transports()
    receiver.receive_data(sender.send_keepalive() + sender.send_end())
    assert drain(receiver) == [KeepAlive(), EndOfStream()]
    with pytest.raises(LocalProtocolError):
        sender.send_data(b"late")


def test_frame_after_end_is_a_protocol_error():
    sender, receiver = transports()
    end = sender.send_end()
    sender._end_sent = False  # a misbehaving peer keeps sending
    receiver.receive_data(end + sender.send_data(b"x"))
    assert receiver.next_event() == EndOfStream()
    with pytest.raises(RemoteProtocolError) as info:
        receiver.next_event()
    assert info.value.code == "DATA_AFTER_END"


def broken_by(mutate):
    sender, receiver = transports()
    frames = bytearray(sender.send_data(b"hello world") + sender.send_data(b"second"))
    receiver.receive_data(bytes(mutate(frames)))
    with pytest.raises(RemoteProtocolError) as info:
        drain(receiver)
    # The failure is sticky: nothing after it is trusted.
    with pytest.raises(RemoteProtocolError):
        receiver.next_event()
    return info.value.code


def flip(position):
    def mutate(frames):
        frames[position] ^= 0x40
        return frames

    return mutate


def test_a_flipped_ciphertext_byte_fails_authentication():
    assert broken_by(flip(8)) == "DECRYPT_FAILED"


def test_the_frame_type_is_authenticated():
    assert broken_by(lambda f: f[:3] + bytes([FrameType.KEEPALIVE]) + f[4:]) == "DECRYPT_FAILED"


def test_a_replayed_or_reordered_frame_fails_authentication():
    first_len = 4 + 11 + 16
    assert broken_by(lambda f: f[:first_len] + f[:first_len]) == "DECRYPT_FAILED"
    assert broken_by(lambda f: f[first_len:] + f[:first_len]) == "DECRYPT_FAILED"


def test_oversized_short_and_unknown_frames_are_refused():
    assert broken_by(lambda f: pack_header(70_000, FrameType.DATA) + f) == "FRAME_TOO_LARGE"
    assert broken_by(lambda f: pack_header(3, FrameType.DATA) + b"abc") == "FRAME_TOO_SHORT"
    assert broken_by(lambda f: pack_header(16, 9) + bytes(16)) == "UNKNOWN_FRAME_TYPE"


@given(st.binary(max_size=2000))
def test_arbitrary_bytes_give_events_or_remote_protocol_error(data):
    _, receiver = transports()
    receiver.receive_data(data)
    try:
        drain(receiver)
    except RemoteProtocolError:
        pass


@settings(max_examples=examples(200))
@given(st.integers(0, 200), st.integers(1, 255))
def test_any_mutated_byte_of_a_valid_stream_is_detected(position, mask):
    sender, receiver = transports()
    frames = bytearray(sender.send_data(b"payload" * 10) + sender.send_keepalive())
    frames[position % len(frames)] ^= mask
    receiver.receive_data(bytes(frames))
    try:
        events = drain(receiver)
    except RemoteProtocolError:
        return
    # A mutated length can leave the parser waiting for more, never with wrong data.
    assert all(e == Data(b"payload" * 10) or e == KeepAlive() for e in events)
    assert len(events) < 2


def test_transport_ciphertexts_match_noise_cipherstate_encryption():
    """Our in-place cipher follows Noise's CipherState: same key, nonce layout, AD."""
    from noise.backends.default import noise_backend
    from noise.noise_protocol import NoiseProtocol
    from noise.state import CipherState

    key = bytes(range(32))
    sender = Transport(key, key)
    reference = CipherState(NoiseProtocol(b"Noise_XX_25519_ChaChaPoly_BLAKE2b", noise_backend))
    reference.initialize_key(key)
    for payload in (b"first", b"second" * 100, b""):
        frames = bytes(sender.send_data(payload)) if payload else sender.send_keepalive()
        frame_type = FrameType.DATA if payload else FrameType.KEEPALIVE
        assert frames[4:] == reference.encrypt_with_ad(bytes([frame_type]), payload)
