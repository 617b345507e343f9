"""Write deterministic bytes to stdout at a bounded rate, so a beam's stream is
still flowing when its session moves from the relay to a punched path.

    python -m tests.netns.slow_feed --size BYTES --seconds S --seed TEXT
                                    [--hold-until FILE REGEX --hold-max S]

With ``--hold-until``, stdout stays open after the last byte until FILE (the
beam's stderr) matches REGEX or ``--hold-max`` seconds pass: the beam lives until
its hole punch has settled, however long that takes.

:func:`expected_sha256` gives the digest of what a given seed and size write.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
from pathlib import Path

CHUNK = 64 * 1024


def chunks(size: int, seed: str):
    block = hashlib.sha256(seed.encode()).digest() * (CHUNK // 32)
    for n, start in enumerate(range(0, size, CHUNK)):
        yield (n.to_bytes(4, "big") + block[4:])[: min(CHUNK, size - start)]


def expected_sha256(size: int, seed: str) -> str:
    digest = hashlib.sha256()
    for chunk in chunks(size, seed):
        digest.update(chunk)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", required=True)
    parser.add_argument("--hold-until", nargs=2, metavar=("FILE", "REGEX"))
    parser.add_argument("--hold-max", type=float, default=30.0)
    args = parser.parse_args()
    count = max(1, -(-args.size // CHUNK))
    pause = args.seconds / count
    out = sys.stdout.buffer
    for chunk in chunks(args.size, args.seed):
        out.write(chunk)
        out.flush()
        time.sleep(pause)
    if args.hold_until:
        path, pattern = Path(args.hold_until[0]), re.compile(args.hold_until[1])
        deadline = time.monotonic() + args.hold_max
        while time.monotonic() < deadline:  # bounded by --hold-max
            if path.exists() and pattern.search(path.read_text(errors="replace")):
                break
            time.sleep(0.05)


if __name__ == "__main__":
    main()
