"""kill -9 a writer in the middle of appending, 20 times: no acknowledged entry is lost."""

import functools
import random

import pytest

from crdt import Database, FsyncPolicy, LogCorrupted, verify_storage
from crdt._base import Base
from p2p.keys import KeyPair
from tests.crdt.crash_writer import append_until_killed
from tests.crdt.helpers import usage_ops
from tests.forked import forked

pytestmark = pytest.mark.slow

def test_kill_9_in_the_middle_of_appending_loses_no_acknowledged_entry(tmp_path):
    rng = random.Random(5)
    keypair = KeyPair.from_seed(b"\x07" * 32)
    acknowledged = 0
    for round_ in range(20):
        writer = functools.partial(append_until_killed, str(tmp_path), round_)
        with forked(writer) as child:
            opened = int(child.lines.readline().split()[1])
            assert opened >= acknowledged
            for _ in range(rng.randint(1, 12)):
                line = child.lines.readline()
                assert line.startswith("acked "), line
                acknowledged = int(line.split()[1])
        # (forked() ended it with SIGKILL while it was appending the next batch)
        with Base.open(tmp_path, keypair, fsync=FsyncPolicy.ALWAYS) as base:
            length = base.lengths()[keypair.public_key]
            assert length >= acknowledged
            usage = base.read_view(lambda v: v.usage("k1"))
            assert sum(u.prompt for u in usage) == length  # each entry adds exactly one
            incremental = base.view.dump()
            base.rebuild()
            assert base.view.dump() == incremental
    # (A kill rarely cuts a write in half: the page cache takes pwrite whole. Torn
    # tails are covered byte by byte in tests/p2p/log/test_log.py.)
    assert acknowledged > 20


async def test_a_flipped_last_byte_after_an_acknowledged_batch_is_reported_and_refused(tmp_path):
    """Regression: after a 500-entry append_many was acknowledged,
    flipping the file's last byte made `db verify` say ok and the next open cut all 500."""
    from typer.testing import CliRunner

    from cli.db import app

    keypair = KeyPair.from_seed(b"\x08" * 32)
    async with await Database.open(tmp_path, keypair, fsync=FsyncPolicy.NEVER) as db:
        await db.append_many(usage_ops("k1", 500))
    (log_file,) = (tmp_path / "db" / "logs").glob(f"{keypair.public_key.hex()}.log")
    data = bytearray(log_file.read_bytes())
    data[-1] ^= 0x01
    log_file.write_bytes(bytes(data))

    problems = verify_storage(tmp_path)
    assert problems and problems[0].fatal
    head_offset = problems[0].where.rsplit(" at byte ", 1)
    assert head_offset[0] == str(log_file) and int(head_offset[1]) < len(data)
    result = CliRunner().invoke(app, ["verify", "--storage", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{log_file} at byte {head_offset[1]}" in result.output
    assert "ok:" not in result.output
    with pytest.raises(LogCorrupted) as refused:
        Base.open(tmp_path, keypair, fsync=FsyncPolicy.NEVER)
    assert (refused.value.path, refused.value.offset) == (str(log_file), int(head_offset[1]))
    assert log_file.read_bytes() == bytes(data)  # nothing was cut
