"""Which of two connections to the same peer to keep, decided the same way by both.

When two peers dial each other at the same moment, each ends up with two
connections: one it initiated and one it accepted. Both sides must drop the
same one, with no message exchanged. The rule (Hyperswarm's): keep the
connection *initiated by the peer with the larger public key*. Each side
evaluates it on the same pair of connections, so they agree.

One case is not a race: when the peer initiated both connections, it must have
lost the first (a restart, a network change) before it dialled again, so the
newer one wins.
"""

from __future__ import annotations

__all__ = ["keep_new_connection"]


def keep_new_connection(
    local_key: bytes, remote_key: bytes, *, existing_initiated_by_us: bool,
    new_initiated_by_us: bool,
) -> bool:
    """True if the new connection should replace the existing one."""
    if existing_initiated_by_us == new_initiated_by_us:
        return True  # the same side dialled twice: it gave up on the first
    larger_is_us = local_key > remote_key
    return new_initiated_by_us == larger_is_us
