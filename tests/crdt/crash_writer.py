"""A writer for the crash test: appends batches until killed, printing each acknowledged length.

Run as ``python -m tests.crdt.crash_writer STORAGE SEED``. A line ``acked N`` means
``append`` returned: the first N entries of the log are durable.
"""

import random
import sys

from crdt import FsyncPolicy
from crdt._base import Base
from p2p.keys import KeyPair
from tests.crdt.helpers import usage_ops


def main() -> None:
    storage, seed = sys.argv[1], int(sys.argv[2])
    keypair = KeyPair.from_seed(b"\x07" * 32)
    rng = random.Random(seed)
    with Base.open(storage, keypair, fsync=FsyncPolicy.ALWAYS) as base:
        print(f"opened {base.lengths()[keypair.public_key]}", flush=True)
        for _ in range(100_000):  # bounded; the test kills us long before
            base.append(usage_ops("k1", rng.randint(1, 100)))
            print(f"acked {base.lengths()[keypair.public_key]}", flush=True)


if __name__ == "__main__":
    main()
