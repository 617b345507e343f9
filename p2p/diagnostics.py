"""Ping and identify: the diagnostic service every CosmicAC peer can serve.

Like libp2p's ``/ipfs/ping`` and ``/ipfs/id`` protocols, these answer "can I
reach this key, how fast, and what is it?" over the whole stack (secret stream,
channel, RPC), so a successful ping proves more than a TCP connect does.
Channel protocol: :data:`PROTOCOL`.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from .keys import format_key
from .rpc import CallContext, Method, Router

__all__ = [
    "IDENTIFY",
    "PING",
    "PROTOCOL",
    "IdentifyParams",
    "Identity",
    "PingPayload",
    "diagnostics_router",
]

PROTOCOL = "cosmicac/diagnostics/1"
#: Ping payloads are capped so a ping cannot be used to move bulk data.
MAX_PING_PAYLOAD_BYTES = 1024


class PingPayload(BaseModel):
    data: bytes = Field(default=b"", max_length=MAX_PING_PAYLOAD_BYTES)


class IdentifyParams(BaseModel):
    pass


class Identity(BaseModel):
    public_key: str
    agent: str
    uptime_s: float
    protocols: list[str]


PING = Method("ping", params=PingPayload, result=PingPayload)
IDENTIFY = Method("identify", params=IdentifyParams, result=Identity)


def diagnostics_router(
    public_key: bytes, *, agent: str, protocols: list[str] | None = None
) -> Router:
    """Return a router that answers :data:`PING` and :data:`IDENTIFY` for this peer."""
    started = time.monotonic()
    router = Router()

    # Inline (they never wait): answered in the reader, so a ping measures the
    # path, not a hand-off to a worker task.
    def ping(params: PingPayload, ctx: CallContext) -> PingPayload:
        return params

    def identify(params: IdentifyParams, ctx: CallContext) -> Identity:
        return Identity(
            public_key=format_key(public_key),
            agent=agent,
            uptime_s=round(time.monotonic() - started, 3),
            protocols=sorted(set(protocols or []) | {PROTOCOL}),
        )

    router.add(PING, ping, inline=True)
    router.add(IDENTIFY, identify, inline=True)
    return router
