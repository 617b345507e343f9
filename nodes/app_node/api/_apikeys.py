"""API keys: created in the shared database (only the secret's hash), shown once.

The key lives in two places: the shared database (``PutApiKey``), which every
proxy-inference replica reads to authenticate requests, and app-node's store,
which keeps who made it and its prefix for listings. The database is written
first: a key the store failed to record is revoked again at once, so no usable
secret is left unlisted.

Members of a team create keys and revoke their own; owners and admins revoke any.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request
from starlette.responses import Response

from crdt import PutApiKey, RevokeApiKey

from .. import codes
from ..model import ApiKeyRecord, Role
from ._common import ApiError, Ctx, Session, forbidden, ok, team_of
from ._models import (
    ApiKeyCreatedOut,
    ApiKeyIn,
    ApiKeyOut,
    ApiKeysOut,
    UsageOut,
    UsageRowOut,
)
from ._spec import RouteSpec

#: Secrets look like ``cac_sk_<43 url-safe chars>``; the prefix shown is its first 14.
SECRET_PREFIX = "cac_sk_"
PREFIX_CHARS = 14


async def create_key(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    body = await ctx.body(request, ApiKeyIn)
    team = team_of(session, body.team_id)
    await ctx.require_role(session, team, Role.MEMBER)
    key_id = secrets.token_hex(12)
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    prefix = secret[:PREFIX_CHARS]
    now = ctx.now()
    db = ctx.services.database
    await db.append([PutApiKey.with_secret(key_id, team, body.name, secret, body.scopes,
                                           int(now * 1000))])
    try:
        await ctx.store(ctx.services.store.api_keys.add, id=key_id, team=team, name=body.name,
                        prefix=prefix, created_by=session.user.id, now=now)
    except ApiError:
        await db.append([RevokeApiKey(key_id, int(now * 1000))])
        raise
    return ok(ApiKeyCreatedOut(id=key_id, key=secret, prefix=prefix, team=team,
                               name=body.name), 201)


async def _key_out(ctx: Ctx, record: ApiKeyRecord) -> ApiKeyOut:
    return ApiKeyOut(id=record.id, team=record.team, name=record.name, prefix=record.prefix,
                     created_by=record.created_by, created_at=record.created_at,
                     revoked_at=record.revoked_at,
                     last_used_ms=await ctx.services.database.last_used(record.id))


async def list_keys(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team = team_of(session, request.query_params.get("team_id"))
    await ctx.require_role(session, team, Role.MEMBER)
    records = await ctx.store(ctx.services.store.api_keys.of_team, team)
    return ok(ApiKeysOut(keys=[await _key_out(ctx, r) for r in records]))


async def _readable_key(ctx: Ctx, session: Session, key_id: str) -> tuple[ApiKeyRecord, Role]:
    """The key's record and the caller's role in its team; 404 for another team's key."""
    try:
        record = await ctx.store(ctx.services.store.api_keys.get, key_id)
    except ApiError as exc:
        if exc.status == 404:
            raise ApiError(codes.NOT_FOUND, f"no API key {key_id} in your teams", "key") from None
        raise
    role = await ctx.store(ctx.services.store.teams.role_of, session.user.id, record.team)
    if role is None:
        raise ApiError(codes.NOT_FOUND, f"no API key {key_id} in your teams", "key")
    return record, role


async def revoke_key(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    record, role = await _readable_key(ctx, session, request.path_params["key"])
    if role is Role.MEMBER and record.created_by != session.user.id:
        raise forbidden("members revoke only keys they created; ask an owner or admin")
    now = ctx.now()
    await ctx.services.database.append([RevokeApiKey(record.id, int(now * 1000))])
    await ctx.store(ctx.services.store.api_keys.revoke, record.id, now=now)
    return ok()


async def usage(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    query = request.query_params
    key_id = query.get("key")
    if not key_id:
        raise ApiError(codes.INVALID, "pass ?key=<API key id>", "key")
    record, _ = await _readable_key(ctx, session, key_id)
    rows = await ctx.services.database.usage(record.id, model=query.get("model"),
                                             day_from=query.get("day_from"),
                                             day_to=query.get("day_to"))
    return ok(UsageOut(key=record.id, rows=[UsageRowOut(
        day=r.day, model=r.model, prompt_tokens=r.prompt, completion_tokens=r.completion,
        total_tokens=r.total, requests=r.requests, audio_seconds=r.audio_ms / 1000)
        for r in rows]))


ROUTES = [
    RouteSpec("POST", "/apikeys", create_key, "Create an API key (its secret is shown once)",
              ApiKeyIn, ApiKeyCreatedOut, 201),
    RouteSpec("GET", "/apikeys", list_keys, "The team's keys with their last use",
              answer=ApiKeysOut, query=("team_id",)),
    RouteSpec("GET", "/apikeys/usage", usage, "A key's usage per day and model",
              answer=UsageOut, query=("key", "model", "day_from", "day_to")),
    RouteSpec("DELETE", "/apikeys/{key}", revoke_key, "Revoke an API key", status=204),
]

__all__ = ["ROUTES"]
