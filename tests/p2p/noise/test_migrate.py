"""A secret stream moving to another path mid-session: MIGRATE frames, offered paths,
and every byte in order across the switch, in both directions at once."""

import os

import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from p2p.errors import ConnectionBroken
from p2p.noise import PATH_ID_BYTES, Migrate, SecretStream
from p2p.noise._stream import FIRST_PATH_ID

from ..helpers import secret_stream_pair

NEW = b"\x01" * PATH_ID_BYTES


async def _pump(stream: SecretStream, data: bytes, piece: int) -> None:
    for start in range(0, len(data), piece):
        await stream.send_all(data[start : start + piece])
        await trio.lowlevel.checkpoint()


async def _drain(stream: SecretStream, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = await stream.receive_some()
        assert chunk, "EOF before every byte arrived"
        got += chunk
    return bytes(got)


async def test_both_ends_derive_the_same_path_secret_and_strangers_do_not():
    left, right = await secret_stream_pair()
    other_left, _other_right = await secret_stream_pair()
    assert left.path_secret == right.path_secret
    assert len(left.path_secret) == 32
    assert left.path_secret != other_left.path_secret
    assert left.path_secret != left.handshake_hash  # the transcript is public, the secret not


async def test_a_stream_moves_mid_transfer_without_losing_or_reordering_a_byte():
    left, right = await secret_stream_pair()
    new_left, new_right = trio.testing.memory_stream_pair()
    data_lr = os.urandom(300_000)
    data_rl = os.urandom(200_000)
    received: dict[str, bytes] = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def receive(name: str, stream: SecretStream, size: int) -> None:
                received[name] = await _drain(stream, size)

            nursery.start_soon(_pump, left, data_lr, 7_000)
            nursery.start_soon(_pump, right, data_rl, 5_000)
            nursery.start_soon(receive, "right", right, len(data_lr))
            nursery.start_soon(receive, "left", left, len(data_rl))
            await trio.lowlevel.checkpoint()
            left.offer_path(NEW, new_left)
            right.offer_path(NEW, new_right)
            await left.migrate(NEW)  # the initiator moves first ...
            while right.read_path_id != NEW:
                await right.wait_path_change()
            await right.migrate(NEW)  # ... the responder follows once it read MIGRATE
    assert received["right"] == data_lr
    assert received["left"] == data_rl
    assert left.write_path_id == left.read_path_id == NEW
    assert right.write_path_id == right.read_path_id == NEW


async def test_the_old_path_is_closed_once_both_directions_left_it_and_the_new_one_carries_on():
    old_left, old_right = trio.testing.memory_stream_pair()
    left, right = await secret_stream_pair(lambda: (old_left, old_right))
    new_left, new_right = trio.testing.memory_stream_pair()
    left.offer_path(NEW, new_left)
    right.offer_path(NEW, new_right)
    await left.migrate(NEW)
    await left.send_all(b"after the move")
    # The responder reads the MIGRATE on the old path, moves, reads on.
    assert await right.receive_some() == b"after the move"
    assert right.read_path_id == NEW
    await right.migrate(NEW)
    await right.send_all(b"reply")
    assert await left.receive_some() == b"reply"
    # Both directions left the first path on both ends: it is closed.
    with pytest.raises(trio.ClosedResourceError):
        await old_left.send_all(b"x")
    with pytest.raises(trio.ClosedResourceError):
        await old_right.send_all(b"x")
    await left.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await new_left.send_all(b"x")


async def test_a_migrate_to_a_path_never_offered_ends_the_stream(autojump_clock):
    left, right = await secret_stream_pair()
    new_left, _unused = trio.testing.memory_stream_pair()
    left.offer_path(NEW, new_left)  # the responder never learns of it
    await left.migrate(NEW)
    with pytest.raises(ConnectionBroken) as info:
        await right.receive_some()
    assert info.value.code == "UNKNOWN_PATH"


async def test_frames_after_migrate_on_the_old_path_end_the_stream():
    old_left, old_right = trio.testing.memory_stream_pair()
    left, right = await secret_stream_pair(lambda: (old_left, old_right))
    right.offer_path(NEW, trio.testing.memory_stream_pair()[1])
    # A forged sender: MIGRATE, then more frames on the same path.
    frames = left._transport.send_migrate(NEW) + left._transport.send_data(b"late")
    await old_left.send_all(frames)
    with pytest.raises(ConnectionBroken) as info:
        await right.receive_some()
    assert info.value.code == "DATA_AFTER_MIGRATE"


async def test_offering_bad_ids_is_refused():
    left, _right = await secret_stream_pair()
    with pytest.raises(ValueError):
        left.offer_path(b"short", trio.testing.memory_stream_pair()[0])
    with pytest.raises(ValueError):
        left.offer_path(FIRST_PATH_ID, trio.testing.memory_stream_pair()[0])
    with pytest.raises(KeyError):
        await left.migrate(NEW)


def test_the_transport_decodes_its_own_migrate_and_refuses_a_bad_body():
    from p2p.errors import RemoteProtocolError
    from p2p.noise import Transport
    from p2p.noise._wire import FrameType

    key_a, key_b = os.urandom(32), os.urandom(32)
    sender, receiver = Transport(key_a, key_b), Transport(key_b, key_a)
    receiver.receive_data(sender.send_migrate(NEW))
    assert receiver.next_event() == Migrate(NEW)
    receiver.receive_data(sender._control(FrameType.MIGRATE, b"x" * 3))
    with pytest.raises(RemoteProtocolError) as info:
        receiver.next_event()
    assert info.value.code == "BAD_MIGRATE"


async def _moved_pair_with_standby(relay=None):
    """A session on a 'relay' pair, moved to a 'direct' pair with the relay kept."""
    relay_left, relay_right = relay or trio.testing.memory_stream_pair()
    left, right = await secret_stream_pair(lambda: (relay_left, relay_right))
    direct_left, direct_right = trio.testing.memory_stream_pair()
    left.offer_path(NEW, direct_left)
    right.offer_path(NEW, direct_right)
    left.keep_standby()
    await left.migrate(NEW)
    return left, right, direct_left, direct_right


@pytest.mark.parametrize("kill", ["initiator_side", "responder_side"])
async def test_a_dead_path_falls_back_to_the_standby_and_no_byte_is_lost(kill):
    left, right, direct_left, direct_right = await _moved_pair_with_standby()
    data_lr, data_rl = os.urandom(600_000), os.urandom(500_000)
    received: dict[str, bytes] = {}
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(left.keep_alive)
            nursery.start_soon(right.keep_alive)

            async def receive(name: str, stream: SecretStream, size: int) -> None:
                received[name] = await _drain(stream, size)

            async with trio.open_nursery() as transfer:
                transfer.start_soon(receive, "right", right, len(data_lr))
                transfer.start_soon(receive, "left", left, len(data_rl))
                # The responder follows the move, keeping the relay as its standby.
                while right.read_path_id != NEW:
                    await right.wait_path_change()
                right.keep_standby()
                await right.migrate(NEW)
                # The direct path dies in the middle of both transfers: each pump sends
                # its first half, then waits for the kill (a timed pause let a fast
                # machine finish both transfers before the path died).
                halves_sent = trio.Semaphore(0)
                path_killed = trio.Event()

                async def pump_around_the_kill(stream: SecretStream, data: bytes, piece: int):
                    half = len(data) // 2
                    await _pump(stream, data[:half], piece)
                    halves_sent.release()
                    await path_killed.wait()
                    await _pump(stream, data[half:], piece)

                transfer.start_soon(pump_around_the_kill, left, data_lr, 6_000)
                transfer.start_soon(pump_around_the_kill, right, data_rl, 5_000)
                for _ in range(2):
                    await halves_sent.acquire()
                await (direct_left if kill == "initiator_side" else direct_right).aclose()
                path_killed.set()
            nursery.cancel_scope.cancel()
    assert received["right"] == data_lr
    assert received["left"] == data_rl
    for stream in (left, right):
        assert stream.read_path_id == stream.write_path_id == FIRST_PATH_ID
        assert NEW in stream._dead_paths


async def test_acknowledged_frames_are_forgotten():
    left, right, _, _ = await _moved_pair_with_standby()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(left.keep_alive)
            nursery.start_soon(right.keep_alive)
            right.keep_standby()  # (both ends keep one: each acknowledges the other)

            async def read_acks() -> None:  # as the mux's reader always does
                while await left.receive_some():
                    pass

            nursery.start_soon(read_acks)
            nursery.start_soon(_pump, left, b"x" * 200_000, 1000)
            await _drain(right, 200_000)  # reads the MIGRATE on the way
            await trio.sleep(0.1)
            # The responder acknowledged (every 32 frames): the sender kept little.
            assert left._unacked_bytes < 40 * 1100
            nursery.cancel_scope.cancel()


async def test_a_forged_resume_ends_the_stream():
    """The initiator's direct path dies; on the standby (relay) path a stranger, who
    has no path secret, sends a RESUME before the peer does: refused."""
    from p2p.noise._wire import FrameType, pack_header

    relay_left, relay_right = trio.testing.memory_stream_pair()
    left, right, _, direct_right = await _moved_pair_with_standby((relay_left, relay_right))
    await left.send_all(b"moved")
    assert await right.receive_some() == b"moved"  # the responder read the MIGRATE...
    right.keep_standby()
    await right.migrate(NEW)  # ...and followed: both directions are direct
    await direct_right.aclose()  # the direct path dies under the initiator's reads
    forged = (0).to_bytes(8, "little") + bytes(16)
    await relay_right.send_all(pack_header(len(forged), FrameType.RESUME) + forged)
    with trio.fail_after(5), pytest.raises(ConnectionBroken) as info:
        await left.receive_some()
    assert info.value.code == "BAD_RESUME"


@given(st.binary(max_size=200))
def test_any_bytes_on_a_standby_path_are_a_resume_or_a_typed_error(data):
    from p2p.errors import RemoteProtocolError
    from p2p.noise import NEED_DATA, Transport

    key_a, key_b = bytes(range(32)), bytes(range(1, 33))
    receiver = Transport(key_b, key_a, initiator=True)
    receiver.expect_resume(data)
    try:
        for _ in range(10):  # bounded: each call consumes a frame or needs data
            if receiver.next_event() is NEED_DATA:
                break
    except RemoteProtocolError:
        pass


def test_a_genuine_resume_skips_what_the_receiver_already_has():
    from p2p.noise import NEED_DATA, Data, Transport

    key_a, key_b = os.urandom(32), os.urandom(32)
    sender = Transport(key_a, key_b, initiator=True)
    receiver = Transport(key_b, key_a, initiator=False)
    frames = [sender.send_data(bytes([n]) * 10) for n in range(5)]
    for frame in frames[:3]:
        receiver.receive_data(frame)
        assert isinstance(receiver.next_event(), Data)
    # The active path died after frame 2; the sender resumes from frame 1 on the standby.
    receiver.expect_resume(sender.resume_frame(1) + b"".join(frames[1:]))
    event = receiver.next_event()
    assert isinstance(event, Data) and bytes(event.data) == bytes([3]) * 10 + bytes([4]) * 10
    assert receiver.next_event() is NEED_DATA


async def test_a_close_cancelled_part_way_still_closes_every_path():
    """A socket stream closes, then raises Cancelled at its checkpoint: the standby
    (and any other path) must be closed all the same, not leaked."""
    relay_left, relay_right = trio.testing.memory_stream_pair()
    left, _right, direct_left, _ = await _moved_pair_with_standby((relay_left, relay_right))
    with trio.CancelScope() as scope:
        scope.cancel()
        await left.aclose()
    for raw in (relay_left, direct_left):
        with pytest.raises(trio.ClosedResourceError):
            await raw.send_all(b"x")
