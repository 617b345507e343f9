"""Sign-up of the first admin, login, logout, ``/me`` and the active team.

Passwords are hashed and checked in a worker thread (scrypt costs most of a
second of CPU); the sign-up path checks that no user exists before hashing so
a closed sign-up costs nothing.

Login is throttled per account (``Limits.login``, :class:`~..ratelimit.FailureThrottle`):
failed logins for an email make that email's logins *from the same address*
back off (429 ``THROTTLED`` with ``Retry-After``, before any scrypt work), and
many addresses failing on one email back off together, except addresses that
logged in to it before. A success clears its address's failures. An unknown
email counts like a wrong password, so the throttle tells nothing either.
"""

from __future__ import annotations

import functools
import secrets

import trio
from starlette.requests import Request
from starlette.responses import Response

from .. import codes
from ..auth import (
    PasswordPolicyError,
    ScryptParams,
    StoredHashError,
    check_password_policy,
    hash_password,
    needs_rehash,
    new_token,
    verify_password,
)
from ..model import TokenKind, User
from ._common import ApiError, Ctx, invalid, ok, throttled, unauthenticated
from ._models import (
    ActiveTeamIn,
    LoginIn,
    MeOut,
    SessionOut,
    SignupIn,
    SignupOut,
    TeamOut,
    user_out,
)
from ._spec import RouteSpec

_WRONG = "the email or password is wrong; check both, or ask an admin to reset the password"


@functools.cache
def _dummy_hash(params: ScryptParams) -> str:
    """A hash of no one's password, checked when the email is unknown."""
    return hash_password(secrets.token_urlsafe(24), params=params)


async def hash_new_password(ctx: Ctx, password: str) -> str:
    """The stored hash of a new password; 422 (field ``password``) if the policy refuses it."""
    try:
        check_password_policy(password)
    except PasswordPolicyError as exc:
        raise invalid("password", f"password: {exc.reason}") from None
    return await trio.to_thread.run_sync(
        lambda: hash_password(password, params=ctx.password_params))


async def open_session(ctx: Ctx, user: User) -> SessionOut:
    """Issue a session token for ``user``; only its hash is stored."""
    token, token_hash = new_token()
    now = ctx.now()
    expires_at = now + ctx.services.lifetimes.session.total_seconds()
    await ctx.store(ctx.services.store.tokens.add, token_hash=token_hash, user=user.id,
                    kind=TokenKind.SESSION, now=now, expires_at=expires_at)
    return SessionOut(token=token, expires_at=expires_at, user=user_out(user))


async def signup(ctx: Ctx, request: Request) -> Response:
    body = await ctx.body(request, SignupIn)
    store = ctx.services.store
    if await ctx.store(store.users.any):
        raise ApiError(codes.CONFLICT, "the first admin exists already; log in, or ask an "
                       "admin for an invitation")
    password_hash = await hash_new_password(ctx, body.password)
    user, team = await ctx.store(store.users.create_first_admin, email=body.email, name=body.name,
                                 password_hash=password_hash, team_name=body.team_name,
                                 now=ctx.now())
    session = await open_session(ctx, user)
    return ok(SignupOut(**session.model_dump(), team=TeamOut(id=team.id, name=team.name,
                                                              role="owner")), 201)


async def login(ctx: Ctx, request: Request) -> Response:
    body = await ctx.body(request, LoginIn)
    store = ctx.services.store
    throttle, source = ctx.throttle("login"), ctx.client(request)
    wait = await throttle.wait_s(body.email, source)
    if wait > 0:
        raise throttled(wait, "too many failed logins for this account; try again later (an "
                        "address it logged in from before is not held back)", source)
    try:
        user = await ctx.store(store.users.by_email, body.email)
    except ApiError as exc:
        if exc.status == 404:
            # as slow as a wrong password, so the answer's timing does not tell which
            # emails have accounts
            await trio.to_thread.run_sync(verify_password, body.password,
                                          _dummy_hash(ctx.password_params))
            await throttle.failed(body.email, source)
            raise unauthenticated(_WRONG) from None
        raise
    try:
        good = await trio.to_thread.run_sync(verify_password, body.password, user.password_hash)
    except StoredHashError:
        raise ApiError(codes.STORE, "this user's stored password is unreadable; ask an "
                       "admin to reset it") from None
    if not good:
        await throttle.failed(body.email, source)
        raise unauthenticated(_WRONG)
    if user.disabled:
        raise unauthenticated("this account is disabled; ask an admin")
    await throttle.succeeded(body.email, source)
    if needs_rehash(user.password_hash, ctx.password_params):
        # the operator raised password_hash: the password is known now, so store
        # it at the new cost (a change meanwhile wins; sessions stay)
        # (hashed as is: a password set under an older policy still logs in)
        stronger = await trio.to_thread.run_sync(
            lambda: hash_password(body.password, params=ctx.password_params))
        await ctx.store(store.users.upgrade_password_hash, user.id, user.password_hash,
                        stronger)
    # an address the user logs in from may also ask for their reset emails past
    # the per-account ceiling a stranger could fill
    await ctx.throttle("reset_email").succeeded(body.email, source)
    if body.cli_public_key is not None:
        user = await ctx.store(store.users.set_cli_key, user.id, body.cli_public_key.lower())
    return ok(await open_session(ctx, user))


async def logout(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    await ctx.store(ctx.services.store.tokens.revoke, session.token_hash, now=ctx.now())
    if ctx.verified is not None:
        ctx.verified.discard(session.token_hash)
    return ok()


async def me_out(ctx: Ctx, user: User) -> MeOut:
    from ._racks import is_operator  # the operators' rule lives with the routes it guards

    teams = await ctx.store(ctx.services.store.teams.of_user, user.id)
    return MeOut(user=user_out(user), active_team=user.active_team,
                 teams=[TeamOut(id=t.id, name=t.name, role=r) for t, r in teams],
                 operator=await is_operator(ctx, user.id))


async def me(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    return ok(await me_out(ctx, session.user))


async def set_active_team(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    body = await ctx.body(request, ActiveTeamIn)
    try:
        user = await ctx.store(ctx.services.store.users.set_active_team, session.user.id,
                               body.team_id)
    except ApiError as exc:
        if exc.status == 404:
            raise ApiError(codes.NOT_FOUND, f"no team {body.team_id} among yours; check "
                           "the id", "team_id") from None
        raise
    return ok(await me_out(ctx, user))


ROUTES = [
    RouteSpec("POST", "/auth/signup", signup, "Sign up the first admin (409 once a user exists)",
              SignupIn, SignupOut, 201, auth=False),
    RouteSpec("POST", "/auth/login", login, "Log in: a bearer session token", LoginIn,
              SessionOut, auth=False),
    RouteSpec("POST", "/auth/logout", logout, "Revoke the session token sent", status=204),
    RouteSpec("GET", "/me", me, "The caller, their teams with roles, the active team",
              answer=MeOut),
    RouteSpec("PUT", "/me/active-team", set_active_team, "Choose the active team",
              ActiveTeamIn, MeOut),
]

__all__ = ["ROUTES", "hash_new_password", "open_session"]
