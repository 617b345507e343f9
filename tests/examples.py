"""How many examples a property test gets in this run.

Each property states the count a thorough run needs (``max_examples=examples(300)``,
or hypothesis's 100 where it states none); a run takes ``CAC_EXAMPLES`` times that.
``make test`` (and CI, on every change) runs them at half: hypothesis draws new
examples on every run, so the changes that land still meet every count many times
over, and the suite costs a fifth less CPU. ``make fuzz`` runs them at four times
their own counts (eight times ``make test``'s), for a change to a decoder, a
handshake or a CRDT, or a night's search.
"""

from __future__ import annotations

import os

__all__ = ["FLOOR", "SCALE", "examples"]

#: The share of each property's own count that this run takes.
SCALE = float(os.environ.get("CAC_EXAMPLES", "0.5"))
if not SCALE > 0:
    raise ValueError(f"CAC_EXAMPLES must be a number above 0, got {SCALE}")

#: Fewer examples than this find little: no property goes below it (unless it
#: asked for fewer itself).
FLOOR = 20


def examples(count: int = 100) -> int:
    """``count`` (the thorough run's) scaled to this run."""
    return max(min(count, FLOOR), round(count * SCALE))
