"""Backoff, skipping and bounds of the swarm's peer table (no I/O)."""

import random

from hypothesis import given
from hypothesis import strategies as st

from p2p.swarm import BackoffPolicy, PeerTable, keep_new_connection

KEY = b"k" * 32


def table(**policy):
    return PeerTable(policy=BackoffPolicy(**policy), rng=random.Random(0))


def test_waits_double_with_jitter_up_to_the_cap():
    peers = table(base_s=1.0, max_s=8.0, skip_after_failures=100)
    waits = [peers.failed(KEY, 0.0, "TIMEOUT") for _ in range(6)]
    for n, wait in enumerate(waits):
        nominal = min(8.0, 2.0**n)
        assert 0.5 * nominal <= wait < 1.5 * nominal
    assert not peers.may_dial(KEY, 0.0)
    assert peers.may_dial(KEY, waits[-1])


def test_a_peer_that_keeps_failing_is_skipped_then_tried_again():
    peers = table(skip_after_failures=3, skip_for_s=600.0)
    peers.failed(KEY, 0.0, "X")
    peers.failed(KEY, 0.0, "X")
    assert peers.failed(KEY, 0.0, "X") == 600.0
    assert not peers.may_dial(KEY, 599.0)
    assert peers.may_dial(KEY, 600.0)
    assert peers.failed(KEY, 600.0, "X") < 2.0  # after the pause: short waits again


def test_a_connection_that_lasted_resets_the_count_and_a_short_one_does_not():
    peers = table(proven_after_s=15.0)
    peers.failed(KEY, 0.0, "X")
    peers.connected(KEY, 10.0)
    assert not peers.may_dial(KEY, 10.0)  # connected: nothing to dial
    assert peers.disconnected(KEY, 30.0) == 0.0
    assert peers.get(KEY).failures == 0 and peers.may_dial(KEY, 30.0)
    peers.connected(KEY, 40.0)
    assert peers.disconnected(KEY, 41.0) > 0  # flapping counts as a failure
    assert peers.get(KEY).failures == 1


def test_the_table_is_bounded_and_never_forgets_live_peers():
    peers = PeerTable(max_peers=10, rng=random.Random(0))
    live = [bytes([n]) * 32 for n in range(5)]
    for n, key in enumerate(live):
        if n % 2:
            peers.connected(key, 0.0)
        else:
            peers.dialling(key)
    for n in range(100, 200):
        peers.touch(bytes([n % 256]) + bytes(31))
    assert len(peers) == 10
    assert all(key in peers for key in live)
    assert peers.forgotten == 100 - 5


keys = st.binary(min_size=32, max_size=32)


@given(keys, keys, st.booleans(), st.booleans())
def test_both_ends_keep_the_same_connection(a, b, a_dialled_first, b_dialled_second):
    if a == b:
        return
    # Connection 1 was dialled by A (if a_dialled_first) else by B; connection 2
    # by the other side, unless the same side dialled twice.
    first_by_a = a_dialled_first
    second_by_a = not a_dialled_first if b_dialled_second else a_dialled_first
    a_keeps_second = keep_new_connection(a, b, existing_initiated_by_us=first_by_a,
                                         new_initiated_by_us=second_by_a)
    b_keeps_second = keep_new_connection(b, a, existing_initiated_by_us=not first_by_a,
                                         new_initiated_by_us=not second_by_a)
    assert a_keeps_second == b_keeps_second
    if first_by_a != second_by_a:  # a race: the larger key's dial wins
        winner_by_a = second_by_a if a_keeps_second else first_by_a
        assert winner_by_a == (a > b)
    else:
        assert a_keeps_second  # the same side redialled: the newer one wins
