"""A secret stream moving to another path mid-session: MIGRATE frames, offered paths,
and every byte in order across the switch, in both directions at once."""

import os

import pytest
import trio
import trio.lowlevel
import trio.testing

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
