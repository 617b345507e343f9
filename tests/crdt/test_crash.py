"""kill -9 a writer in the middle of appending, 20 times: no acknowledged entry is lost."""

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from crdt import Base, FsyncPolicy
from p2p.keys import KeyPair

ROOT = Path(__file__).resolve().parents[2]


def test_kill_9_in_the_middle_of_appending_loses_no_acknowledged_entry(tmp_path):
    rng = random.Random(5)
    keypair = KeyPair.from_seed(b"\x07" * 32)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    acknowledged = 0
    for round_ in range(20):
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.crdt.crash_writer", str(tmp_path), str(round_)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        try:
            opened = int(writer.stdout.readline().split()[1])
            assert opened >= acknowledged
            for _ in range(rng.randint(1, 12)):
                line = writer.stdout.readline()
                assert line.startswith("acked "), line
                acknowledged = int(line.split()[1])
        finally:
            writer.send_signal(signal.SIGKILL)  # while it is appending the next batch
            writer.wait(timeout=30)
            writer.stdout.close()
        with Base.open(tmp_path, keypair, fsync=FsyncPolicy.ALWAYS) as base:
            length = base.lengths()[keypair.public_key]
            assert length >= acknowledged
            usage = base.read_view(lambda v: v.usage("k1"))
            assert sum(u.prompt for u in usage) == length  # each entry adds exactly one
            incremental = base.view.dump()
            base.rebuild()
            assert base.view.dump() == incremental
    # (A kill rarely cuts a write in half: the page cache takes pwrite whole. Torn
    # tails are covered byte by byte in test_log.py.)
    assert acknowledged > 20
