"""View checkpoints: a fresh replica starts from an admin's checkpoint, then catches up.

What is proved here: a checkpoint decodes only into a well-formed header or a
typed refusal, whatever the bytes; a forged, tampered, foreign, stale or
non-admin checkpoint is refused (and nothing changes); a replica that
installed a checkpoint and then received the logs holds exactly the view and
gate of one that replayed every entry; over a swarm a fresh reader
fast-forwards, and a stranger's key gets no checkpoint (``test_readers.py``).
"""

from __future__ import annotations

import dataclasses
import random

import hypothesis.strategies as st
import msgpack
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings

from crdt import AddTokenUsage, AddWriter, MarkKeyUsed, PutApiKey, RemoveWriter, RevokeApiKey
from crdt._base import Base
from crdt._checkpoint import (
    PAGE_BYTES,
    SIGNING_DOMAIN,
    Checkpoint,
    CheckpointRefused,
    decode_clocks,
    decode_header,
    decode_state,
    verify_header,
    verify_page,
)
from p2p.keys import KeyPair
from tests.crdt.helpers import open_replica, pull, usage_ops

DAY = "2026-11-29"


def admin_with_two_writers(tmp_path, n: int = 40) -> tuple[Base, Base, KeyPair, KeyPair]:
    a_key, b_key = KeyPair.generate(), KeyPair.generate()
    a = open_replica(tmp_path / "a", a_key)
    b = open_replica(tmp_path / "b", b_key, a_key.public_key)
    a.append([[AddWriter(b_key.public_key)]])
    pull(b, a)
    a.append(usage_ops("k1", n))
    b.append(usage_ops("k2", n))
    a.append([[PutApiKey("k1", "team", "ci", bytes(32), ("chat",), 1)], [MarkKeyUsed("k1", 5)]])
    pull(a, b)
    pull(b, a)
    return a, b, a_key, b_key


def install(base: Base, checkpoint: Checkpoint) -> int:
    """What the replicator does with a checkpoint it fetched."""
    header = decode_header(checkpoint.header_bytes)
    verify_header(header, checkpoint.header_bytes, checkpoint.signature, base.bootstrap)
    for index, page in enumerate(checkpoint.pages):
        verify_page(header, index, page)
    state = decode_state(header, b"".join(checkpoint.pages[:header.state_pages]))
    clocks = decode_clocks(header, state, b"".join(checkpoint.pages[header.state_pages:]))
    return base.install_checkpoint(header, state, clocks)


def written(base: Base) -> dict[bytes, int]:
    return {key: n for key, n in base.lengths().items() if n}


def view_and_gate(base: Base):
    return (base.view.dump(), base.gate.lengths(), base.gate.stopped,
            {k: list(c) for k, (c, _) in base.gate.released_state().items()},
            base.admission)


# -- decoding hostile bytes --------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes_decode_to_a_header_or_a_typed_refusal(data):
    try:
        decode_header(data)
    except CheckpointRefused as exc:
        assert exc.code in ("MALFORMED", "TOO_LARGE")


@pytest.fixture(scope="module")
def sample_checkpoint(tmp_path_factory):
    a, b, _, _ = admin_with_two_writers(tmp_path_factory.mktemp("sample"), n=5)
    try:
        return a.make_checkpoint(1), a.bootstrap
    finally:
        a.close()
        b.close()


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_mutated_header_or_body_is_refused_with_a_code_never_another_error(
        sample_checkpoint, data):
    checkpoint, db = sample_checkpoint
    which = data.draw(st.sampled_from(["header", "state", "clocks"]))
    header = checkpoint.header
    original = {"header": checkpoint.header_bytes,
                "state": b"".join(checkpoint.pages[:header.state_pages]),
                "clocks": b"".join(checkpoint.pages[header.state_pages:])}[which]
    at = data.draw(st.integers(0, len(original) - 1))
    cut = data.draw(st.booleans())
    flipped = (original[:at] if cut else
               original[:at] + bytes([original[at] ^ data.draw(st.integers(1, 255))])
               + original[at + 1:])
    try:
        if which == "header":
            verify_header(decode_header(flipped), flipped, checkpoint.signature, db)
        else:
            state = decode_state(header, flipped if which == "state" else original_state(
                checkpoint))
            if which == "clocks":
                decode_clocks(header, state, flipped)
    except CheckpointRefused as exc:
        assert exc.code in ("MALFORMED", "TOO_LARGE", "BAD_SIGNATURE", "BAD_DIGEST", "WRONG_DB",
                            "BAD_HEAD", "NOT_AN_ADMIN")
    else:
        # Every header byte is signed, and the view's rows have their digest;
        # only a flip msgpack or zlib decodes to the same values gets through.
        assert which != "header"


def original_state(checkpoint: Checkpoint) -> bytes:
    return b"".join(checkpoint.pages[:checkpoint.header.state_pages])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**64 - 1), st.binary(max_size=40),
                          st.text(max_size=8), st.lists(st.integers(0, 2**32), max_size=3)),
                max_size=10))
def test_any_msgpack_array_decodes_to_a_header_or_a_typed_refusal(items):
    try:
        decode_header(msgpack.packb(items, use_bin_type=True))
    except CheckpointRefused as exc:
        assert exc.code == "MALFORMED"


# -- installing --------------------------------------------------------------------------


def test_a_fresh_replica_installs_a_checkpoint_then_the_logs_change_nothing(tmp_path):
    a, b, a_key, _ = admin_with_two_writers(tmp_path)
    fresh = open_replica(tmp_path / "c", KeyPair.generate(), a_key.public_key)
    try:
        checkpoint = a.make_checkpoint(1)
        assert len(checkpoint.pages) == 2  # the state, the clocks
        gained = install(fresh, checkpoint)
        assert gained == checkpoint.header.released == sum(a.gate.lengths().values())
        assert fresh.lengths() == {k: 0 for k in fresh.lengths()}  # no log yet
        assert view_and_gate(fresh) == view_and_gate(a)
        assert fresh.read_view(lambda v: v.key("k1")).team == "team"
        pull(fresh, a)  # the logs arrive: stored, checked, not replayed
        assert written(fresh) == written(a)
        assert view_and_gate(fresh) == view_and_gate(a)
        assert fresh.checkpoints_dropped == 0
        # It goes on from there: new entries of both writers apply.
        a.append(usage_ops("k1", 3))
        b.append(usage_ops("k9", 2))
        pull(a, b)
        pull(fresh, a)
        assert view_and_gate(fresh) == view_and_gate(a)
    finally:
        for base in (a, b, fresh):
            base.close()


def test_new_entries_apply_once_the_log_prefix_is_in(tmp_path):
    """Entries past the checkpoint wait for the log before them (the chain
    is checked from the start); once it is in they apply, exactly once."""
    a, b, a_key, _ = admin_with_two_writers(tmp_path)
    fresh = open_replica(tmp_path / "c", KeyPair.generate(), a_key.public_key)
    try:
        install(fresh, a.make_checkpoint(1))
        a.append(usage_ops("k1", 7))
        pull(fresh, a)
        assert view_and_gate(fresh) == view_and_gate(a)
        assert sum(u.prompt for u in fresh.read_view(lambda v: v.usage("k1"))) == 47
    finally:
        for base in (a, b, fresh):
            base.close()


def test_a_replica_ahead_of_part_of_it_installs_it_and_keeps_its_own_entries(tmp_path):
    a, b, a_key, _ = admin_with_two_writers(tmp_path)
    try:
        checkpoint = a.make_checkpoint(1)
        # b has all of it already: nothing to gain.
        with pytest.raises(CheckpointRefused) as refused:
            install(b, checkpoint)
        assert refused.value.code == "STALE"
        fresh = open_replica(tmp_path / "c", KeyPair.generate(), a_key.public_key)
        try:
            pull(fresh, b)  # part of it, through another peer
            a.append(usage_ops("k1", 5))
            install(fresh, a.make_checkpoint(2))
            pull(fresh, a)
            assert view_and_gate(fresh) == view_and_gate(a)
        finally:
            fresh.close()
    finally:
        a.close()
        b.close()


def test_a_checkpoint_older_than_what_the_replica_has_is_refused(tmp_path):
    a, b, a_key, _ = admin_with_two_writers(tmp_path)
    fresh = open_replica(tmp_path / "c", KeyPair.generate(), a_key.public_key)
    try:
        old = a.make_checkpoint(1)
        a.append(usage_ops("k1", 5))
        install(fresh, a.make_checkpoint(2))
        before = view_and_gate(fresh)
        with pytest.raises(CheckpointRefused) as refused:
            install(fresh, old)
        assert refused.value.code == "STALE"
        assert view_and_gate(fresh) == before
    finally:
        for base in (a, b, fresh):
            base.close()


def forged(checkpoint: Checkpoint, signer: KeyPair, **changes) -> Checkpoint:
    header = dataclasses.replace(checkpoint.header, signer=signer.public_key, **changes)
    header_bytes = header.encode()
    return Checkpoint(header, header_bytes, signer.sign(SIGNING_DOMAIN + header_bytes),
                      checkpoint.pages)


def test_forged_foreign_and_non_admin_checkpoints_are_refused_and_change_nothing(tmp_path):
    a, b, a_key, b_key = admin_with_two_writers(tmp_path)
    fresh = open_replica(tmp_path / "c", KeyPair.generate(), a_key.public_key)
    other = open_replica(tmp_path / "o", KeyPair.generate())
    try:
        good = a.make_checkpoint(1)
        empty = view_and_gate(fresh)

        def code(checkpoint) -> str:
            with pytest.raises(CheckpointRefused) as refused:
                install(fresh, checkpoint)
            assert view_and_gate(fresh) == empty
            return refused.value.code

        stranger = KeyPair.generate()
        # Signed by someone who is no admin (a stranger; a writer that is not one).
        assert code(forged(good, stranger)) == "NOT_AN_ADMIN"
        assert code(forged(good, b_key)) == "NOT_AN_ADMIN"
        # A header changed after signing.
        tampered = good.header_bytes.replace(good.header.view_digest, bytes(32))
        assert code(Checkpoint(good.header, tampered, good.signature, good.pages)) == \
            "BAD_SIGNATURE"
        # The admin's signature over a view digest its rows do not have.
        assert code(forged(good, a_key, view_digest=bytes(32))) == "BAD_DIGEST"
        # A page changed (the state's, the clocks').
        for at in range(len(good.pages)):
            page = bytearray(good.pages[at])
            page[len(page) // 2] ^= 1
            pages = [*good.pages[:at], bytes(page), *good.pages[at + 1:]]
            assert code(Checkpoint(good.header, good.header_bytes, good.signature,
                                   pages)) == "BAD_DIGEST"
        # Another database's checkpoint.
        other.append(usage_ops("k1", 3))
        assert code(other.make_checkpoint(1)) == "WRONG_DB"
        # A writer's head its writer did not sign.
        w0 = good.header.writers[0]
        bad_head = dataclasses.replace(w0, head_signature=bytes(64))
        assert code(forged(good, a_key, writers=(bad_head, *good.header.writers[1:]))) == \
            "BAD_HEAD"
        # And the real one still installs.
        install(fresh, good)
        assert view_and_gate(fresh) == view_and_gate(a)
    finally:
        for base in (a, b, fresh, other):
            base.close()


def test_a_checkpoint_whose_head_the_log_does_not_hold_is_dropped_for_a_full_replay(tmp_path):
    """A writer that signed two histories (a fork): the checkpoint named one,
    the log that arrives is the other. The replica drops the checkpoint and
    replays what its logs hold, as without one."""
    a_key, w_key = KeyPair.generate(), KeyPair.generate()
    a = open_replica(tmp_path / "a", a_key)
    a.append([[AddWriter(w_key.public_key)]])
    w1 = open_replica(tmp_path / "w1", w_key, a_key.public_key)
    w2 = open_replica(tmp_path / "w2", w_key, a_key.public_key)
    fresh = open_replica(tmp_path / "c", KeyPair.generate(), a_key.public_key)
    try:
        pull(w1, a)
        pull(w2, a)
        w1.append(usage_ops("k1", 4))
        w2.append(usage_ops("k2", 4))  # the same key, another history
        pull(a, w1)
        install(fresh, a.make_checkpoint(1))
        pull(fresh, w2)
        assert fresh.checkpoints_dropped == 1
        replayed = open_replica(tmp_path / "r", KeyPair.generate(), a_key.public_key)
        try:
            pull(replayed, w2)
            assert view_and_gate(fresh) == view_and_gate(replayed)
        finally:
            replayed.close()
    finally:
        for base in (a, w1, w2, fresh):
            base.close()


def test_a_large_body_comes_in_pages(tmp_path):
    a_key = KeyPair.generate()
    a = open_replica(tmp_path / "a", a_key)
    fresh = open_replica(tmp_path / "c", KeyPair.generate(), a_key.public_key)
    try:
        a.append([[AddTokenUsage(f"key-{n}", "m", DAY, prompt=n)] for n in range(9000)])
        checkpoint = a.make_checkpoint(1)
        assert checkpoint.header.state_pages >= 2
        state_pages = checkpoint.pages[:checkpoint.header.state_pages]
        assert all(len(p) == PAGE_BYTES for p in state_pages[:-1])
        install(fresh, checkpoint)
        assert view_and_gate(fresh) == view_and_gate(a)
    finally:
        a.close()
        fresh.close()


# -- convergence: a checkpoint then the logs == every entry replayed ---------------------


ops_strategy = st.lists(st.tuples(
    st.integers(0, 2),  # which writer
    st.sampled_from(["usage", "put", "revoke", "used", "sync"]),
    st.integers(0, 4)), min_size=1, max_size=40)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=ops_strategy, cut=st.floats(0, 1), remove=st.booleans(), seed=st.integers(0, 99))
def test_fast_forward_then_catch_up_equals_full_replay(tmp_path_factory, steps, cut, remove,
                                                       seed):
    folder = tmp_path_factory.mktemp("prop")
    rng = random.Random(seed)
    keys = [KeyPair.generate() for _ in range(3)]
    bases = [open_replica(folder / "w0", keys[0])]
    bases += [open_replica(folder / f"w{i}", keys[i], keys[0].public_key) for i in (1, 2)]
    fresh = open_replica(folder / "fresh", KeyPair.generate(), keys[0].public_key)
    replay = open_replica(folder / "replay", KeyPair.generate(), keys[0].public_key)
    try:
        admin = bases[0]
        admin.append([[AddWriter(keys[1].public_key)], [AddWriter(keys[2].public_key)]])
        for base in bases[1:]:
            pull(base, admin)
        checkpoint_at = int(cut * len(steps))
        checkpoint = None
        for n, (who, what, k) in enumerate(steps):
            if n == checkpoint_at:
                checkpoint = admin.make_checkpoint(n)
                if remove:
                    admin.append([[RemoveWriter(keys[2].public_key,
                                                admin.lengths().get(keys[2].public_key, 0))]])
            base = bases[who]
            if what == "sync":
                pull(base, bases[k % 3], rng=rng)
                continue
            if not base.admission.is_writer(base.key):
                continue
            op = {"usage": AddTokenUsage(f"k{k}", "m", DAY, prompt=k + 1),
                  "put": PutApiKey(f"k{k}", f"t{who}", "n", bytes(32), ("chat",), n),
                  "revoke": RevokeApiKey(f"k{k}", n),
                  "used": MarkKeyUsed(f"k{k}", n)}[what]
            base.append([[op]])
        for base in bases:
            for other in bases:
                pull(base, other, rng=rng)
        if checkpoint is None:
            checkpoint = admin.make_checkpoint(len(steps))
        try:
            install(fresh, checkpoint)
        except CheckpointRefused as exc:
            assert exc.code == "STALE" and checkpoint.header.released == 0
        for base in bases:
            pull(fresh, base, rng=rng)
            pull(replay, base, rng=rng)
        assert written(fresh) == written(replay)
        assert view_and_gate(fresh) == view_and_gate(replay)
    finally:
        for base in (*bases, fresh, replay):
            base.close()


# -- over a swarm ------------------------------------------------------------------------


@pytest.fixture
def clock():
    """As in test_replication: virtual time that jumps after 2 ms of real idleness."""
    return trio.testing.MockClock(autojump_threshold=0.002)


async def test_a_fresh_reader_fast_forwards_over_a_swarm_and_converges(tmp_path, clock):
    from tests.crdt.test_replication import start_replica, total_prompt
    from tests.p2p.helpers import wait_until
    from tests.p2p.swarm.helpers import memory_swarm_net

    a_key, r_key = KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(120):
        async with memory_swarm_net() as net:
            a = await start_replica(net, tmp_path / "a", a_key, readers=[r_key.public_key])
            await a.db.append_many(usage_ops("k1", 1500))
            await a.db.make_checkpoint(1)
            r = await start_replica(net, tmp_path / "r", r_key, bootstrap=a.db.bootstrap)
            await wait_until(lambda: r.db.lengths.get(a_key.public_key) == 1500, limit_s=30)
            assert await total_prompt(r.db) == 1500
            assert r.db.metrics.registry.get_sample_value(
                "crdt_checkpoints_total", {"outcome": "installed"}) == 1
            await a.db.append_many(usage_ops("k1", 2))
            await wait_until(lambda: r.db.lengths.get(a_key.public_key) == 1502, limit_s=30)
            assert (await r.db.read(lambda v: v.dump())) == (await a.db.read(lambda v: v.dump()))


def test_a_replica_closed_before_its_logs_arrived_reopens_where_the_checkpoint_left_it(
        tmp_path):
    a, b, a_key, _ = admin_with_two_writers(tmp_path)
    c_key = KeyPair.generate()
    fresh = open_replica(tmp_path / "c", c_key, a_key.public_key)
    try:
        install(fresh, a.make_checkpoint(1))
        expected = view_and_gate(fresh)
        fresh.close()
        fresh = open_replica(tmp_path / "c", c_key, a_key.public_key)
        assert view_and_gate(fresh) == expected
        assert fresh.rebuilds == 0
        pull(fresh, a)
        assert view_and_gate(fresh) == view_and_gate(a)
    finally:
        for base in (a, b, fresh):
            base.close()


async def test_a_forged_checkpoint_is_refused_and_the_replica_replays_every_entry(
        tmp_path, clock):
    """A peer serving a checkpoint signed by a key that is no admin: the fresh
    replica refuses it (NOT_AN_ADMIN, counted) and catches up by replaying the
    logs, ending with the same view."""
    from crdt._messages import CheckpointResult
    from crdt._replication import Replicator
    from tests.crdt.test_replication import start_replica, total_prompt
    from tests.p2p.helpers import wait_until
    from tests.p2p.swarm.helpers import memory_swarm_net

    stranger = KeyPair.generate()

    class ForgingReplicator(Replicator):
        async def _checkpoint(self, params, ctx):
            real = await self.db.make_checkpoint(1)
            self.db.checkpoint = fake = forged(real, stranger)
            return CheckpointResult(header=fake.header_bytes, signature=fake.signature)

    a_key, r_key = KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(120):
        async with memory_swarm_net() as net:
            a = await start_replica(net, tmp_path / "a", a_key, readers=[r_key.public_key],
                                    replicator_class=ForgingReplicator)
            await a.db.append_many(usage_ops("k1", 1500))
            r = await start_replica(net, tmp_path / "r", r_key, bootstrap=a.db.bootstrap)
            await wait_until(lambda: r.db.lengths.get(a_key.public_key) == 1500, limit_s=60)
            assert await total_prompt(r.db) == 1500

            def sample(outcome):
                return r.db.metrics.registry.get_sample_value(
                    "crdt_checkpoints_total", {"outcome": outcome}) or 0
            assert sample("refused_NOT_AN_ADMIN") >= 1  # once per connection tried
            assert sample("installed") == 0
            assert r.db.base.rebuilds == 0
            assert (await r.db.read(lambda v: v.dump())) == (await a.db.read(lambda v: v.dump()))
