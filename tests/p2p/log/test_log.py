"""WriterLog: round trips, torn tails, corruption, replication and crashes, on real files."""

from __future__ import annotations

import functools
import logging
import random
import tempfile
import time
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.keys import KeyPair
from p2p.log import (
    GENESIS_HASH,
    FsyncPolicy,
    Head,
    InvalidBatch,
    LogCorrupted,
    LogInUse,
    NotWriter,
    RecordTooLarge,
    WriterLog,
    verify_file,
)
from p2p.log._records import ENTRY, HEAD, MAGIC, _frame, _read_record
from tests.examples import examples
from tests.forked import forked

pytestmark = pytest.mark.slow

WRITER = KeyPair.from_seed(bytes(range(32)))
OTHER = KeyPair.from_seed(bytes(range(1, 33)))


def records(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, end) of every well-formed record, walking from the start."""
    out, pos = [], 0
    while pos < len(data):
        rtype, _body, end = _read_record(data, pos)
        out.append((pos, rtype, end))
        pos = end
    return out


def write_log(path: Path, batches: list[list[bytes]]) -> list[tuple[int, int]]:
    """Write batches; return (file size, length) after each acknowledged batch."""
    acked = []
    with WriterLog.open(path, WRITER.public_key, WRITER, fsync=FsyncPolicy.NEVER) as wlog:
        for batch in batches:
            length = wlog.append_batch(batch)
            acked.append((path.stat().st_size, length))
    return acked


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


BATCHES = [[b"alpha", b"beta"], [b"gamma"], [b"delta", b"epsilon", b"zeta"], [b"eta"]]
ALL = [p for batch in BATCHES for p in batch]


# --- round trip ----------------------------------------------------------------------------


def test_round_trip_through_reopen(tmp_path):
    path = tmp_path / f"{WRITER.hex}.log"
    with WriterLog.open(path, WRITER.public_key, WRITER) as wlog:
        assert (wlog.length, wlog.head_hash, wlog.head) == (0, GENESIS_HASH, None)
        lengths = [wlog.append_batch(batch) for batch in BATCHES]
        head_hash, head = wlog.head_hash, wlog.head
        assert list(wlog.entries()) == ALL
    assert lengths == [2, 3, 6, 7]

    with WriterLog.open(path, WRITER.public_key) as reader:
        assert reader.recovery is None
        assert (reader.length, reader.head_hash, reader.head) == (7, head_hash, head)
        assert list(reader.entries()) == ALL
        assert list(reader.entries(2, 5)) == ALL[2:5]
        assert reader.entry(6) == b"eta"
        assert [h.length for h in reader.heads()] == lengths
        assert all(h.verify(WRITER.public_key) for h in reader.heads())
        with pytest.raises(IndexError):
            reader.entry(7)


def test_reader_without_key_cannot_append(tmp_path):
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    before = path.read_bytes()
    with WriterLog.open(path, WRITER.public_key) as reader:
        assert not reader.is_writer
        with pytest.raises(NotWriter) as info:
            reader.append_batch([b"nope"])
        assert info.value.code == "NOT_WRITER"
    assert path.read_bytes() == before


def test_wrong_key_pair_is_refused(tmp_path):
    with pytest.raises(NotWriter):
        WriterLog.open(tmp_path / "w.log", WRITER.public_key, OTHER)


def test_second_handle_on_the_same_file_is_refused(tmp_path):
    path = tmp_path / "w.log"
    with WriterLog.open(path, WRITER.public_key, WRITER), pytest.raises(LogInUse):
        WriterLog.open(path, WRITER.public_key)
    WriterLog.open(path, WRITER.public_key).close()  # the lock went with the handle


def test_empty_batch_writes_nothing_and_oversized_payload_is_refused(tmp_path):
    path = tmp_path / "w.log"
    with WriterLog.open(path, WRITER.public_key, WRITER, fsync=FsyncPolicy.NEVER) as wlog:
        assert wlog.append_batch([]) == 0
        with pytest.raises(RecordTooLarge):
            wlog.append_batch([b"ok", bytes(16 * 1024 * 1024)])
        assert wlog.length == 0
        assert wlog.append_batch([b"ok"]) == 1
    with WriterLog.open(path, WRITER.public_key) as reader:
        assert list(reader.entries()) == [b"ok"]


# --- torn tails ----------------------------------------------------------------------------


def expected_length(acked: list[tuple[int, int]], cut: int) -> int:
    return max((length for end, length in acked if end <= cut), default=0)


def test_truncating_at_every_offset_keeps_exactly_the_complete_batches(tmp_path):
    original = tmp_path / "orig.log"
    acked = write_log(original, BATCHES)
    data = original.read_bytes()
    path = tmp_path / "cut.log"
    for cut in range(len(data) + 1):
        path.write_bytes(data[:cut])
        with WriterLog.open(path, WRITER.public_key, fsync=FsyncPolicy.NEVER) as wlog:
            length = expected_length(acked, cut)
            assert wlog.length == length, cut
            assert list(wlog.entries()) == ALL[:length]
            durable_end = max((end for end, _ in acked if end <= cut), default=0)
            if cut == durable_end:
                assert wlog.recovery is None
            else:
                assert wlog.recovery.offset == durable_end
                assert wlog.recovery.dropped_bytes == cut - durable_end
        assert path.stat().st_size == durable_end


@settings(max_examples=examples(60), deadline=None)
@given(
    batches=st.lists(
        st.lists(st.binary(max_size=40), min_size=1, max_size=4), min_size=1, max_size=5
    ),
    where=st.floats(0, 1),
)
def test_any_truncation_recovers_the_last_complete_head(batches, where):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.log"
        acked = write_log(path, batches)
        data = path.read_bytes()
        cut = int(where * len(data))
        path.write_bytes(data[:cut])
        with WriterLog.open(path, WRITER.public_key, WRITER, fsync=FsyncPolicy.NEVER) as wlog:
            length = expected_length(acked, cut)
            payloads = [p for batch in batches for p in batch]
            assert list(wlog.entries()) == payloads[:length]
            # The recovered log is a good base for further appends.
            wlog.append_batch([b"after"])
        report = verify_file(path, WRITER.public_key)
        assert report.length == length + 1 and report.tail is None


def test_recovery_is_logged(tmp_path, caplog):
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    with path.open("ab") as f:
        f.write(MAGIC + b"\x01\x00\x00")
    with caplog.at_level(logging.WARNING, logger="p2p.log._log"):
        WriterLog.open(path, WRITER.public_key).close()
    assert "dropped 7 bytes" in caplog.text


def test_entries_without_a_head_are_dropped(tmp_path):
    path = tmp_path / "w.log"
    acked = write_log(path, BATCHES)
    with path.open("ab") as f:  # a crash between a batch's entries and its head
        f.write(_frame(ENTRY, msgpack.packb([7, b"unacked"])))
    with WriterLog.open(path, WRITER.public_key) as wlog:
        assert wlog.length == 7
        assert wlog.recovery.dropped_entries == 1
        assert wlog.recovery.offset == acked[-1][0]
    assert path.stat().st_size == acked[-1][0]


def test_flipped_bit_in_the_last_signed_head_is_damage_not_a_torn_tail(tmp_path):
    """Regression: a flipped byte in the last head made it look torn,
    so `verify` said ok and opening cut every entry that head acknowledged."""
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    last_head = records(path.read_bytes())[-1]
    flip_bit(path, last_head[0] + 20)
    assert_corrupted(path, last_head[0], "BAD_CRC")


def test_flipped_last_byte_of_a_big_batch_is_refused_not_cut(tmp_path):
    path = tmp_path / "w.log"
    write_log(path, [[f"entry-{i}".encode() for i in range(500)]])
    last_head = records(path.read_bytes())[-1]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert_corrupted(path, last_head[0], "BAD_CRC")


def test_a_damaged_last_length_field_is_damage_even_though_the_record_looks_short(tmp_path):
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    last_head = records(path.read_bytes())[-1]
    flip_bit(path, last_head[0] + 8, 0)  # the length's low byte: the body now runs past the end
    assert_corrupted(path, last_head[0], "BAD_RECORD")


def test_zeros_to_the_end_of_the_file_are_a_torn_tail(tmp_path):
    """What a filesystem that kept the new size but not the data leaves after power loss."""
    path = tmp_path / "w.log"
    acked = write_log(path, BATCHES)
    with path.open("ab") as f:
        f.write(bytes(300))
    with WriterLog.open(path, WRITER.public_key) as wlog:
        assert wlog.length == len(ALL)
        assert wlog.recovery.offset == acked[-1][0] and wlog.recovery.dropped_bytes == 300
    assert path.stat().st_size == acked[-1][0]


def flip_byte(data: bytes, offset: int, mask: int) -> bytes:
    damaged = bytearray(data)
    damaged[offset] ^= mask
    return bytes(damaged)


def assert_refused_everywhere(path: Path, data: bytes) -> None:
    """``data`` (a damaged acknowledged log) is reported by verify and refused by open."""
    path.write_bytes(data)
    with pytest.raises(LogCorrupted):
        verify_file(path, WRITER.public_key)
    with pytest.raises(LogCorrupted):
        WriterLog.open(path, WRITER.public_key, WRITER, fsync=FsyncPolicy.NEVER).close()
    with pytest.raises(LogCorrupted):
        WriterLog.open(path, WRITER.public_key, read_only=True).close()
    assert path.read_bytes() == data  # never cut


def test_every_single_flipped_byte_of_an_acknowledged_log_is_refused(tmp_path):
    original = tmp_path / "orig.log"
    write_log(original, BATCHES)
    data = original.read_bytes()
    path = tmp_path / "damaged.log"
    rng = random.Random(10)
    for offset in range(len(data)):
        assert_refused_everywhere(path, flip_byte(data, offset, rng.randint(1, 255)))


@settings(max_examples=examples(80), deadline=None)
@given(
    batches=st.lists(
        st.lists(st.binary(max_size=60), min_size=1, max_size=5), min_size=1, max_size=4
    ),
    where=st.floats(0, 1, exclude_max=True),
    mask=st.integers(1, 255),
)
def test_any_flipped_byte_of_any_acknowledged_log_is_detected_never_truncated(
        batches, where, mask):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.log"
        write_log(path, batches)
        data = path.read_bytes()
        assert_refused_everywhere(path, flip_byte(data, int(where * len(data)), mask))


@settings(max_examples=examples(80), deadline=None)
@given(
    acknowledged=st.lists(
        st.lists(st.binary(max_size=60), min_size=1, max_size=4), max_size=3
    ),
    unacknowledged=st.lists(st.binary(max_size=60), min_size=1, max_size=4),
    where=st.floats(0, 1, exclude_max=True),
)
def test_a_cut_inside_the_unacknowledged_last_batch_is_recovered_and_keeps_every_acked_entry(
        acknowledged, unacknowledged, where):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.log"
        acked = write_log(path, [*acknowledged, unacknowledged])
        data = path.read_bytes()
        durable_end = acked[-2][0] if len(acked) > 1 else 0
        # Strictly inside the last batch: at least one byte of it, never all of it.
        cut = durable_end + 1 + int(where * (len(data) - durable_end - 1))
        path.write_bytes(data[:cut])
        assert verify_file(path, WRITER.public_key).tail.offset == durable_end
        with WriterLog.open(path, WRITER.public_key, fsync=FsyncPolicy.NEVER) as wlog:
            assert list(wlog.entries()) == [p for batch in acknowledged for p in batch]
            assert wlog.recovery.offset == durable_end
        assert path.read_bytes() == data[:durable_end]


# --- corruption in the middle --------------------------------------------------------------


def assert_corrupted(path: Path, offset: int, *codes: str) -> None:
    before = path.read_bytes()
    with pytest.raises(LogCorrupted) as info:
        WriterLog.open(path, WRITER.public_key, WRITER)
    assert info.value.path == str(path) and info.value.offset == offset
    assert info.value.code in codes
    assert str(path) in str(info.value) and f"byte {offset}" in str(info.value)
    assert path.read_bytes() == before  # nothing truncated or rewritten
    with pytest.raises(LogCorrupted):
        verify_file(path, WRITER.public_key)


def test_flipped_bit_in_a_middle_payload_is_corruption(tmp_path):
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    data = path.read_bytes()
    at = data.index(b"gamma")
    entry_offset = max(off for off, _, _ in records(data) if off < at)
    flip_bit(path, at + 2)
    assert_corrupted(path, entry_offset, "BAD_CRC")


def test_flipped_bit_in_a_middle_head_signature_is_corruption(tmp_path):
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    first_head = next(r for r in records(path.read_bytes()) if r[1] == HEAD)
    flip_bit(path, first_head[2] - 5)  # inside the signature, the body's last field
    assert_corrupted(path, first_head[0], "BAD_CRC")


def test_flipped_bit_in_a_record_length_is_corruption(tmp_path):
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    second = records(path.read_bytes())[1]
    flip_bit(path, second[0] + 7, 3)  # the body length now runs past later records
    assert_corrupted(path, second[0], "BAD_CRC", "BAD_RECORD")


def test_forged_signature_with_a_valid_checksum_is_corruption(tmp_path):
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    data = path.read_bytes()
    off, _, _ = records(data)[-1]  # the very last record: forgery is never a torn tail
    head = list(_read_record_head(data, off))
    forged = Head(head[0], head[1], OTHER.sign(b"whatever"))
    record = _frame(HEAD, msgpack.packb([forged.length, forged.head_hash, forged.signature]))
    path.write_bytes(data[:off] + record)
    assert_corrupted(path, off, "BAD_SIGNATURE")


def test_a_forged_earlier_head_is_found_by_verify_while_open_checks_the_last(tmp_path):
    """Opening checks the last head's signature (it covers every entry through the chain);
    `verify_file` (db verify) checks them all, so a head forged on disk is still found."""
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    data = path.read_bytes()
    off, _, end = [r for r in records(data) if r[1] == HEAD][1]  # an earlier head
    length, head_hash, _ = _read_record_head(data, off)
    forged = _frame(HEAD, msgpack.packb([length, head_hash, OTHER.sign(b"whatever")]))
    path.write_bytes(data[:off] + forged + data[end:])
    with WriterLog.open(path, WRITER.public_key) as wlog:
        assert wlog.length == len(ALL)
    with pytest.raises(LogCorrupted) as corrupted:
        verify_file(path, WRITER.public_key)
    assert (corrupted.value.offset, corrupted.value.code) == (off, "BAD_SIGNATURE")


def test_rewritten_entry_with_a_valid_checksum_breaks_the_chain(tmp_path):
    path = tmp_path / "w.log"
    write_log(path, BATCHES)
    data = path.read_bytes()
    recs = records(data)
    off, _, end = recs[0]
    replaced = _frame(ENTRY, msgpack.packb([0, b"ALPHA"]))  # same size as b"alpha"
    path.write_bytes(data[:off] + replaced + data[end:])
    head_offset = next(r[0] for r in recs if r[1] == HEAD)
    assert_corrupted(path, head_offset, "BAD_CHAIN")


def _read_record_head(data: bytes, offset: int) -> tuple[int, bytes, bytes]:
    _, body, _ = _read_record(data, offset)
    return tuple(msgpack.unpackb(body))


# --- replication ---------------------------------------------------------------------------


def test_replica_copies_a_writer_log_with_append_verified(tmp_path):
    source = tmp_path / "source.log"
    write_log(source, BATCHES)
    with (
        WriterLog.open(source, WRITER.public_key) as src,
        WriterLog.open(tmp_path / "replica.log", WRITER.public_key) as replica,
    ):
        done = 0
        for head in src.heads():
            batch = list(src.entries(done, head.length))
            assert replica.append_verified(batch, head) == head.length
            done = head.length
        assert replica.head == src.head
    assert (tmp_path / "replica.log").read_bytes() == source.read_bytes()


def test_append_verified_refuses_forged_heads_and_broken_chains(tmp_path):
    with WriterLog.open(
        tmp_path / "replica.log", WRITER.public_key, fsync=FsyncPolicy.NEVER
    ) as replica:
        replica.append_verified([b"a"], _signed_head(WRITER, [b"a"]))
        before = (tmp_path / "replica.log").read_bytes()

        good = _signed_head(WRITER, [b"a", b"b", b"c"])
        forged = _signed_head(OTHER, [b"a", b"b", b"c"])
        for payloads, head, code in [
            ([b"b", b"c"], forged, "BAD_SIGNATURE"),
            ([b"b", b"X"], good, "BAD_CHAIN"),
            ([b"c", b"b"], good, "BAD_CHAIN"),
            ([b"b"], good, "BAD_LENGTH"),
            ([b"b", b"c"], Head(3, good.head_hash, good.signature[:-1] + b"\0"), "BAD_SIGNATURE"),
        ]:
            with pytest.raises(InvalidBatch) as info:
                replica.append_verified(payloads, head)
            assert info.value.code == code
            assert replica.length == 1
        assert (tmp_path / "replica.log").read_bytes() == before
        assert replica.append_verified([b"b", b"c"], good) == 3


def _signed_head(keypair: KeyPair, payloads: list[bytes]) -> Head:
    """What a writer with these entries would sign, computed through a scratch log."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        WriterLog.open(
            Path(tmp) / "scratch.log", keypair.public_key, keypair, fsync=FsyncPolicy.NEVER
        ) as scratch,
    ):
        scratch.append_batch(payloads)
        return scratch.head


# --- crashes -------------------------------------------------------------------------------

def append_until_killed(path: Path, seed: int, out) -> None:
    """The forked writer: random batches until killed, each acknowledged length printed."""
    rng = random.Random(seed)
    wlog = WriterLog.open(path, WRITER.public_key, WRITER)
    print("ready", wlog.length, file=out)
    while True:
        n = wlog.length
        count = rng.randint(1, 8)
        batch = [f"entry-{n + k}".encode() * rng.randint(1, 50) for k in range(count)]
        print(wlog.append_batch(batch), file=out)


def test_sigkill_never_loses_an_acknowledged_batch(tmp_path):
    rng = random.Random(1234)
    acknowledged_ever = 0
    for run in range(20):
        # Every run recovers the previous run's log and appends to it; a fresh
        # file every 5 runs keeps the rescans (and the test) short.
        if run % 5 == 0:
            path = tmp_path / f"crash-{run}.log"
            acknowledged = 0
        with forked(functools.partial(append_until_killed, path, run)) as child:
            ready = child.lines.readline().split()
            assert ready[0] == "ready", ready
            assert int(ready[1]) >= acknowledged
            time.sleep(rng.uniform(0, 0.08))  # short: the log grows fast
            child.kill()
            printed = [int(line) for line in child.lines.read().split()]
        acknowledged = max([acknowledged, *printed])

        # Opening checks framing, the whole chain and every signature.
        with WriterLog.open(path, WRITER.public_key) as wlog:
            assert wlog.length >= acknowledged
            for i in rng.sample(range(wlog.length), min(20, wlog.length)):
                assert wlog.entry(i).startswith(f"entry-{i}".encode())
        assert verify_file(path, WRITER.public_key).tail is None
        acknowledged_ever += acknowledged
    assert acknowledged_ever > 0  # the kills did land among appends
