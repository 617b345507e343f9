"""What the move to p2p.log added: signature namespaces, prepared batches, sync."""

from __future__ import annotations

import pytest

import crdt
from p2p.keys import KeyPair
from p2p.log import (
    CRDT_NAMESPACE,
    FsyncPolicy,
    InvalidBatch,
    LogCorrupted,
    LogError,
    LogInUse,
    WriterLog,
    verify_file,
)

WRITER = KeyPair.from_seed(b"\x21" * 32)
QUEUE_NS = b"test/queue\x00"


def write(path, namespace, payloads=(b"a", b"b")):
    with WriterLog.open(path, WRITER.public_key, WRITER, fsync=FsyncPolicy.NEVER,
                        namespace=namespace) as log:
        log.append_batch(list(payloads))
        return log.segment(0, 1 << 20)


def test_a_log_verifies_only_in_its_own_namespace(tmp_path):
    entries, head = write(tmp_path / "q.log", QUEUE_NS)
    assert head.verify(WRITER.public_key, QUEUE_NS)
    assert not head.verify(WRITER.public_key)  # the default: the database's
    with pytest.raises(LogCorrupted) as refused:
        WriterLog.open(tmp_path / "q.log", WRITER.public_key, read_only=True)
    assert refused.value.code == "BAD_SIGNATURE"
    assert verify_file(tmp_path / "q.log", WRITER.public_key, namespace=QUEUE_NS).length == 2
    with WriterLog.open(tmp_path / "copy.log", WRITER.public_key,
                        fsync=FsyncPolicy.NEVER) as database_copy:
        with pytest.raises(InvalidBatch) as replayed:
            database_copy.append_verified(entries, head)
        assert replayed.value.code == "BAD_SIGNATURE"
    with WriterLog.open(tmp_path / "copy2.log", WRITER.public_key, fsync=FsyncPolicy.NEVER,
                        namespace=QUEUE_NS) as queue_copy:
        assert queue_copy.append_verified(entries, head) == 2


def test_the_database_namespace_is_the_old_constant(tmp_path):
    """Logs written before namespaces existed still verify."""
    assert CRDT_NAMESPACE == b"cosmicac/crdt/log-head/v1\x00"
    write(tmp_path / "db.log", CRDT_NAMESPACE)
    assert verify_file(tmp_path / "db.log", WRITER.public_key).length == 2


def test_prepared_batches_write_once_and_only_onto_the_log_they_continue(tmp_path):
    with WriterLog.open(tmp_path / "p.log", WRITER.public_key, WRITER,
                        fsync=FsyncPolicy.NEVER) as log:
        first = log.prepare_batch([b"1", b"2"])
        stale = log.prepare_batch([b"x"])
        assert log.length == 0  # nothing written yet
        assert log.write_prepared(first) == 2
        assert log.head == first.head
        with pytest.raises(ValueError):
            log.write_prepared(stale)
        log.sync()
        assert log.length == 2
    assert verify_file(tmp_path / "p.log", WRITER.public_key).length == 2


def test_crdt_raises_its_own_subclasses_of_the_log_errors():
    assert issubclass(crdt.LogCorrupted, LogCorrupted)
    assert issubclass(crdt.LogCorrupted, crdt.CrdtError)
    assert issubclass(crdt.InvalidBatch, LogError)
    with pytest.raises(crdt.LogInUse) as translated, crdt._errors.log_errors():
        raise LogInUse("busy", code="LOG_IN_USE")
    assert translated.value.message == "busy" and translated.value.code == "LOG_IN_USE"
    with pytest.raises(crdt.LogCorrupted) as corrupted, crdt._errors.log_errors():
        raise LogCorrupted("bad", path="/x", offset=7, code="BAD_CRC")
    assert (corrupted.value.path, corrupted.value.offset) == ("/x", 7)
    assert corrupted.value.code == "BAD_CRC"
