"""The secret-stream trio driver over in-memory streams, with the autojump clock."""

import pytest
import trio
import trio.testing

from p2p.errors import ConnectionBroken, HandshakeError, IdleTimeout
from p2p.noise import SecretStream, SecretStreamConfig

from ..helpers import ALICE, BOB, MALLORY, secret_stream_pair


async def test_secret_stream_passes_trio_generic_stream_checks():
    await trio.testing.check_half_closeable_stream(secret_stream_pair, None)


async def test_secret_stream_passes_generic_checks_in_lockstep():
    await trio.testing.check_half_closeable_stream(
        lambda: secret_stream_pair(trio.testing.lockstep_stream_pair), None
    )


async def test_both_sides_know_each_others_keys():
    left, right = await secret_stream_pair()
    assert left.remote_public_key == BOB.public_key
    assert right.remote_public_key == ALICE.public_key
    assert left.handshake_hash == right.handshake_hash
    assert left.is_initiator and not right.is_initiator


async def test_key_mismatch_fails_closed_and_closes_the_transport(autojump_clock):
    left, right = trio.testing.memory_stream_pair()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def respond():
                with pytest.raises(HandshakeError) as info:
                    await SecretStream.responder(right, BOB)
                assert info.value.code == "CLOSED"

            nursery.start_soon(respond)
            with pytest.raises(HandshakeError) as info:
                await SecretStream.initiator(left, ALICE, MALLORY.public_key)
    assert info.value.code == "KEY_MISMATCH"
    assert info.value.expected == MALLORY.public_key
    assert info.value.actual == BOB.public_key
    with pytest.raises(trio.ClosedResourceError):
        await left.send_all(b"x")


async def test_silent_peer_times_the_handshake_out(autojump_clock):
    left, _right = trio.testing.memory_stream_pair()
    config = SecretStreamConfig(handshake_timeout_s=3)
    start = trio.current_time()
    with trio.fail_after(10), pytest.raises(HandshakeError) as info:
        await SecretStream.initiator(left, ALICE, BOB.public_key, config=config)
    assert info.value.code == "TIMEOUT"
    assert trio.current_time() - start == pytest.approx(3)


async def test_keepalives_hold_a_quiet_stream_open(autojump_clock):
    config = SecretStreamConfig(keepalive_interval_s=5, idle_timeout_s=12)
    left, right = await secret_stream_pair(config=config)
    with trio.fail_after(200):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(left.keep_alive)
            nursery.start_soon(right.keep_alive)

            async def quiet_reader():
                assert await right.receive_some() == b"after a long quiet"

            nursery.start_soon(quiet_reader)
            await trio.sleep(100)
            await left.send_all(b"after a long quiet")
            await trio.sleep(1)
            await left.aclose()
            await right.aclose()
    assert right.statistics().keepalives_received >= 100 // 5 - 1


async def test_idle_timeout_ends_a_stream_whose_peer_went_silent(autojump_clock):
    config = SecretStreamConfig(keepalive_interval_s=None, idle_timeout_s=12)
    _left, right = await secret_stream_pair(config=config)
    start = trio.current_time()
    with trio.fail_after(60), pytest.raises(IdleTimeout) as info:
        await right.receive_some()
    assert info.value.code == "IDLE_TIMEOUT"
    assert trio.current_time() - start == pytest.approx(12)
    with pytest.raises(IdleTimeout):
        await right.send_all(b"x")


async def test_keep_alive_task_enforces_the_idle_timeout_on_waiting_reads(autojump_clock):
    config = SecretStreamConfig(keepalive_interval_s=5, idle_timeout_s=12)
    _left, right = await secret_stream_pair(config=config)  # left never sends
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(right.keep_alive)
            await trio.testing.wait_all_tasks_blocked()
            start = trio.current_time()
            with pytest.raises(IdleTimeout):
                await right.receive_some()
            assert trio.current_time() - start == pytest.approx(12)
    assert right.statistics().keepalives_received == 0


async def test_the_idle_watch_fires_at_a_deadline_that_rounding_puts_a_hair_early(mock_clock):
    """0.001 + 1.0 - 0.001 < 1.0 in floating point. A watch that tested
    ``now - since >= idle`` woke at ``since + idle``, found it not yet due, and
    waited for that same instant again, forever, so a virtual clock never
    moved on (a swarm test hung on it)."""
    config = SecretStreamConfig(keepalive_interval_s=None, idle_timeout_s=1.0)
    _left, right = await secret_stream_pair(config=config)  # left never sends
    outcome = []

    async def read() -> None:
        with pytest.raises(IdleTimeout):
            await right.receive_some()
        outcome.append("timed out")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(right.keep_alive)
        mock_clock.jump(0.001 - trio.current_time())
        nursery.start_soon(read)  # waiting since 0.001
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1.0)  # now == 0.001 + 1.0, the watch's deadline
        for _ in range(1000):  # bounded: a spinning watch must fail the test, not hang it
            if outcome:
                break
            await trio.lowlevel.checkpoint()
        assert outcome == ["timed out"]
        nursery.cancel_scope.cancel()


async def test_the_idle_watch_goes_on_after_our_end_is_sent(autojump_clock):
    config = SecretStreamConfig(keepalive_interval_s=5, idle_timeout_s=12)
    _left, right = await secret_stream_pair(config=config)  # left never sends
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(right.keep_alive)
            await trio.testing.wait_all_tasks_blocked()  # the watch is running
            await right.send_eof()  # keep-alives stop; the idle watch must not
            with pytest.raises(IdleTimeout):
                await right.receive_some()


async def test_tampered_byte_ends_the_stream_with_a_typed_error():
    left_raw, right_raw = trio.testing.memory_stream_pair()
    left, right = await secret_stream_pair(lambda: (left_raw, right_raw))
    await left.send_all(b"fine")
    assert await right.receive_some() == b"fine"
    # Corrupt one byte of the next frame in flight from left to right.
    frames = left._transport.send_data(b"evil")
    tampered = bytearray(frames)
    tampered[-1] ^= 1
    await left_raw.send_all(bytes(tampered))
    with pytest.raises(ConnectionBroken) as info:
        await right.receive_some()
    assert info.value.code == "DECRYPT_FAILED"
    with pytest.raises(ConnectionBroken):
        await right.receive_some()


async def test_peer_closing_mid_frame_is_reported_as_truncation():
    left_raw, right_raw = trio.testing.memory_stream_pair()
    left, right = await secret_stream_pair(lambda: (left_raw, right_raw))
    frames = left._transport.send_data(b"x" * 100)
    await left_raw.send_all(frames[:50])
    await left_raw.aclose()
    with pytest.raises(ConnectionBroken) as info:
        await right.receive_some()
    assert info.value.code == "TRUNCATED"


async def test_large_writes_arrive_whole_and_in_order():
    left, right = await secret_stream_pair()
    payload = bytes(range(256)) * 10_000
    received = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_all, payload)
        while len(received) < len(payload):
            received += await right.receive_some()
    assert received == payload
    assert right.statistics().bytes_received == len(payload)


async def test_a_send_cancelled_part_way_breaks_the_stream(autojump_clock):
    left, _right = await secret_stream_pair(trio.testing.lockstep_stream_pair)
    with trio.move_on_after(1):
        await left.send_all(b"x" * 100_000)  # nobody reads: blocks, then is cancelled
    with pytest.raises(ConnectionBroken) as info:
        await left.send_all(b"more")
    assert info.value.code == "SEND_CANCELLED"


async def test_send_eof_gives_the_peer_eof_and_keeps_the_other_direction():
    left, right = await secret_stream_pair()
    await left.send_all(b"request")
    await left.send_eof()
    assert await right.receive_some() == b"request"
    assert await right.receive_some() == b""
    await right.send_all(b"response")
    assert await left.receive_some() == b"response"
