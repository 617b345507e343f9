"""``GET /api/swarm``: how a user's machine joins the swarm (``cosmicac shell JOB``).

A shell is a peer of the swarm: the CLI dials the job's agent by its key, found
on the DHT, and comes through a blind relay when the agent cannot be reached
directly. It needs the DHT's bootstrap addresses, the relays' keys and where
the relays listen (so it pairs through one with no DHT reachable), which only
the deployment knows: app-node advertises its own settings here.

What it advertises is ``cli_bootstrap`` when set, else ``bootstrap``:
app-node may reach the DHT on an internal address (a cluster network, a
container name) that a laptop cannot, so the operator can name the public
one. Relay keys are the same for everybody (``relays``).

Any session may read it: the bootstrap addresses and relay keys are not
secrets (every agent's cloud-init carries them), but an anonymous scan of the
deployment has no use for them either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from ..services import SwarmAdvert
from ._common import Ctx, ok
from ._spec import RouteSpec

if TYPE_CHECKING:
    from ..settings import AppNodeSettings

__all__ = ["ROUTES", "SwarmOut", "swarm_advert"]


class SwarmOut(BaseModel):
    #: DHT bootstrap nodes, ``host:port`` (``[v6]:port`` for IPv6).
    bootstrap: list[str]
    #: Blind relays' public keys, 64 hex characters each.
    relays: list[str]
    #: Where each relay listens (``host:port``), by key: reached with no DHT.
    relay_addresses: dict[str, list[str]] = {}


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def swarm_advert(settings: AppNodeSettings) -> SwarmAdvert:
    """The advert of app-node's settings: ``cli_bootstrap`` (else ``bootstrap``) and ``relays``."""
    bootstrap = settings.cli_bootstrap if settings.cli_bootstrap is not None \
        else settings.bootstrap
    return SwarmAdvert(bootstrap=tuple(_address(h, p) for h, p in bootstrap),
                       relays=tuple(key.hex() for key in settings.relays),
                       relay_addresses=tuple(
                           (key.hex(), tuple(_address(h, p) for h, p in where))
                           for key, where in settings.relay_addresses.items()
                           if key in settings.relays and where))


async def get_swarm(ctx: Ctx, request: Request) -> Response:
    await ctx.session(request)
    # Services built without it (tests) advertise nothing; the CLI then asks
    # for --bootstrap or --address.
    advert = ctx.services.swarm
    return ok(SwarmOut(bootstrap=list(advert.bootstrap), relays=list(advert.relays),
                       relay_addresses={key: list(where)
                                        for key, where in advert.relay_addresses}))


ROUTES = [
    RouteSpec("GET", "/swarm", get_swarm, "The DHT bootstrap, relay keys and relay "
              "addresses to join the swarm with (cosmicac shell)", answer=SwarmOut),
]
