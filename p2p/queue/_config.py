"""The knobs of one queue end."""

from __future__ import annotations

from dataclasses import dataclass

from p2p.log import FsyncPolicy

__all__ = ["QueueConfig"]


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """Limits of one queue end; every buffer in the queue is bounded by one of these.

    The defaults keep every head-to-head run of the log (one group commit) in
    one mux message (512 KiB by default): ``max_batch_bytes`` plus one
    ``max_payload_bytes`` plus framing.
    """

    #: ALWAYS: publish, ack and received entries are fsynced before they count.
    #: NEVER is for tests and benchmarks only (a crash may lose them).
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    #: Largest payload (bytes) one publish carries; more raises PayloadTooLarge.
    max_payload_bytes: int = 64 * 1024
    #: Largest ordering key (UTF-8 bytes).
    max_key_bytes: int = 256
    #: One group commit (one append, one fsync, one signed head) takes at most
    #: this many publishes...
    max_batch_entries: int = 1024
    #: ...and stops adding publishes once it holds this many payload bytes.
    max_batch_bytes: int = 256 * 1024
    #: Publishes waiting for an append; a publisher past it waits for room
    #: (backpressure, never an error or unbounded memory).
    max_queued_publishes: int = 16384
    #: Entry bytes a receiver holds while waiting for the signed head that ends
    #: a run sent in pieces; a peer that sends more ends the channel (RUN_TOO_LARGE).
    max_pending_bytes: int = 2 * 1024 * 1024
    #: Recently written entries kept in memory (each direction) so the sender
    #: and the consumer need not read them back from disk; older ones are read
    #: from the log.
    cache_bytes: int = 8 * 1024 * 1024
    #: Entries read from disk per read when the cache does not have them.
    read_batch_entries: int = 512

    def __post_init__(self) -> None:
        for name in ("max_payload_bytes", "max_key_bytes", "max_batch_entries",
                     "max_batch_bytes", "max_queued_publishes", "max_pending_bytes",
                     "cache_bytes", "read_batch_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"QueueConfig.{name} must be >= 1")
