"""The writer the crash test forks and kills: appends batches until killed.

A line ``acked N`` means ``append`` returned: the first N entries of the log are durable.
Batches of 1 to 20 entries: each is one write and one fsync whatever its size, and
the test reopens and rebuilds the whole log after every kill, so longer batches only
made the log (and each check) longer.
"""

import random
from typing import TextIO

from crdt import FsyncPolicy
from crdt._base import Base
from p2p.keys import KeyPair
from tests.crdt.helpers import usage_ops


def append_until_killed(storage: str, seed: int, out: TextIO) -> None:
    keypair = KeyPair.from_seed(b"\x07" * 32)
    rng = random.Random(seed)
    with Base.open(storage, keypair, fsync=FsyncPolicy.ALWAYS) as base:
        print(f"opened {base.lengths()[keypair.public_key]}", file=out)
        for _ in range(100_000):  # bounded; the test kills us long before
            base.append(usage_ops("k1", rng.randint(1, 20)))
            print(f"acked {base.lengths()[keypair.public_key]}", file=out)
