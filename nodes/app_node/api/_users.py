"""Passwords (change, reset by email), the caller's name, and the operators' list of users.

Password reset, theory of operation
-----------------------------------
``POST /auth/password-reset {email}`` answers 202 at once, whatever the
email: the request path does the same work for every address (parse, check
the form, schedule), and the rest runs as a background task after the answer
is sent: look the account up, and only if it exists (and is not disabled)
store a one-time ``reset`` token (its SHA-256 only, in the tokens table,
expiring after ``Lifetimes.password_reset``, an hour) and email
``<public_url>/reset?token=<token>``. So neither the status, the body nor the
time to answer tells whether the address has an account; a failed email is
logged, never reported to the requester.

Reset emails are throttled (``Limits.reset_email``): per (email, address) and per
email, whether or not the account exists (so a 429 tells nothing either), with
addresses the user logged in from exempt from the per-email ceiling. A reset
link that is not one counts as a token guess of the address (``token_guess``).

``POST /auth/password-reset/confirm {token, password}`` checks the token
(404 unknown, 410 used, expired or its account disabled; both with ``field:
token``) before hashing anything, then ``store.users.reset_password`` sets the hash
and revokes every token of the user, the reset token and every session
included, in one transaction: the link works once, and whoever had the old
password is logged out everywhere.

``PUT /me/password`` is the logged-in change: the current password is
checked (scrypt, 403 ``field: current_password`` if wrong; wrong ones count as
failed logins of the account, ``Limits.login``), every token of the
user is revoked, and a fresh session is returned so the caller stays logged in.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from .. import codes
from ..auth import StoredHashError, hash_token, new_token, verify_password
from ..email import EmailError, EmailKind, EmailMessage, send_with_retry
from ..errors import AppNodeError, Expired, NotFound
from ..model import TokenKind, normal_email
from ._auth_routes import hash_new_password, me_out, open_session
from ._common import ApiError, Ctx, ok, throttled
from ._models import (
    MeIn,
    MeOut,
    PasswordChangeIn,
    PasswordResetConfirmIn,
    PasswordResetIn,
    SessionOut,
    TeamOut,
    UserListedOut,
    UsersOut,
    user_out,
)
from ._racks import require_operator
from ._spec import RouteSpec

if TYPE_CHECKING:
    from ..store import Store

T = TypeVar("T")
_log = logging.getLogger(__name__)

_BAD_LINK = ("this reset link is not valid (mistyped or not a reset link); request a new "
             "one with POST /api/auth/password-reset")
_USED_LINK = ("this reset link was used already or has expired (it works once, for an "
              "hour); request a new one with POST /api/auth/password-reset")


# -- reset by email ------------------------------------------------------------------


async def request_reset(ctx: Ctx, request: Request) -> Response:
    body = await ctx.body(request, PasswordResetIn)
    try:
        email = normal_email(body.email)
    except AppNodeError as exc:
        raise ApiError.of(exc) from None
    throttle, source = ctx.throttle("reset_email"), ctx.client(request)
    wait = await throttle.wait_s(email, source)
    if wait > 0:
        raise throttled(wait, "too many password reset requests for this email", source)
    await throttle.failed(email, source)  # every email sent counts, for any address
    return Response(status_code=202, background=BackgroundTask(send_reset, ctx, email))


async def send_reset(ctx: Ctx, email: str) -> None:
    """The background half of a reset request: token and email if the account exists.

    It runs after the answer was sent, so nothing it meets can reach the requester:
    every failure is logged here.
    """
    try:
        await _send_reset(ctx, email)
    except Exception:
        _log.exception("password reset: sending the link failed")


async def _send_reset(ctx: Ctx, email: str) -> None:
    store = ctx.services.store
    try:
        user = await ctx.store(store.users.by_email, email)
        if user.disabled:
            _log.info("password reset asked for disabled account %s: nothing sent", user.id)
            return
        token, token_hash = new_token()
        now = ctx.now()
        await ctx.store(store.tokens.add, token_hash=token_hash, user=user.id,
                        kind=TokenKind.RESET, now=now,
                        expires_at=now + ctx.services.lifetimes.password_reset.total_seconds())
    except ApiError as exc:
        if exc.status == 404:
            _log.info("password reset asked for an address with no account: nothing sent")
        else:
            _log.warning("password reset for an account failed before sending: %s", exc)
        return
    minutes = int(ctx.services.lifetimes.password_reset.total_seconds() // 60)
    link = f"{ctx.services.public_url.rstrip('/')}/reset?token={token}"
    message = EmailMessage(
        to=(user.email,), kind=EmailKind.PASSWORD_RESET,
        subject="Reset your CosmicAC password",
        text=(f"Someone (we hope you) asked to reset the password of {user.email} on "
              f"CosmicAC.\n\nChoose a new password: {link}\n\nThe link works once, for "
              f"{minutes} minutes. Using it logs you out everywhere. If you did not ask, "
              f"ignore this email: your password stays as it is.\n"),
        idempotency_key=f"password-reset-{token_hash[:40]}")
    try:
        await send_with_retry(ctx.services.email, message)
    except EmailError as exc:
        _log.warning("the password reset email to user %s could not be sent: %s", user.id, exc)


async def confirm_reset(ctx: Ctx, request: Request) -> Response:
    body = await ctx.body(request, PasswordResetConfirmIn)
    store = ctx.services.store
    token_hash = hash_token(body.token)
    guesses, source = ctx.throttle("token_guess"), ctx.client(request)
    wait = await guesses.wait_s("", source)
    if wait > 0:
        raise throttled(wait, "too many reset links that were not valid from your address",
                        source)

    async def with_token(method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``method`` in a worker thread; the token's refusals name the ``token`` field."""
        try:
            return await trio.to_thread.run_sync(functools.partial(method, *args, **kwargs))
        except NotFound:
            await guesses.failed("", source)
            raise ApiError(codes.NOT_FOUND, _BAD_LINK, "token") from None
        except Expired:
            await guesses.failed("", source)
            raise ApiError(codes.EXPIRED, _USED_LINK, "token") from None
        except AppNodeError as exc:
            raise ApiError.of(exc) from exc

    # the token first: a wrong link costs no scrypt hash
    await with_token(store.tokens.valid, token_hash, now=ctx.now(), kind=TokenKind.RESET)
    password_hash = await hash_new_password(ctx, body.password)
    await with_token(store.users.reset_password, token_hash, password_hash, now=ctx.now())
    await guesses.succeeded("", source)
    return ok()


# -- the caller ------------------------------------------------------------------------


async def change_password(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    body = await ctx.body(request, PasswordChangeIn)
    # a stolen session guessing the password counts as failed logins of the account
    throttle, source, email = ctx.throttle("login"), ctx.client(request), session.user.email
    wait = await throttle.wait_s(email, source)
    if wait > 0:
        raise throttled(wait, "too many wrong passwords for this account from your address",
                        source)
    try:
        good = await trio.to_thread.run_sync(verify_password, body.current_password,
                                             session.user.password_hash)
    except StoredHashError:
        raise ApiError(codes.STORE, "your stored password is unreadable; reset it with "
                       "POST /api/auth/password-reset") from None
    if not good:
        await throttle.failed(email, source)
        raise ApiError(codes.FORBIDDEN, "current_password is wrong; check it, or reset the "
                       "password by email", "current_password")
    await throttle.succeeded(email, source)
    password_hash = await hash_new_password(ctx, body.password)
    user = await ctx.store(ctx.services.store.users.set_password, session.user.id, password_hash,
                           now=ctx.now())
    return ok(await open_session(ctx, user))


async def update_me(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    body = await ctx.body(request, MeIn)
    user = await ctx.store(ctx.services.store.users.update, session.user.id, name=body.name)
    return ok(await me_out(ctx, user))


# -- every user (operators) ------------------------------------------------------------


def _users_page(store: Store, limit: int, cursor: str | None) -> UsersOut:
    page = store.users.page(limit=limit, cursor=cursor)
    return UsersOut(users=[UserListedOut(
        user=user_out(u), created_at=u.created_at, disabled=u.disabled,
        teams=[TeamOut(id=t.id, name=t.name, role=r) for t, r in store.teams.of_user(u.id)])
        for u in page.items], next=page.next)


async def list_users(ctx: Ctx, request: Request) -> Response:
    await require_operator(ctx, await ctx.session(request))
    query = request.query_params
    try:
        limit = int(query.get("limit", "100"))
    except ValueError:
        raise ApiError(codes.INVALID, "limit must be a whole number", "limit") from None
    return ok(await ctx.store(_users_page, ctx.services.store, limit, query.get("cursor")))


ROUTES = [
    RouteSpec("POST", "/auth/password-reset", request_reset,
              "Email a password reset link (202 whether or not the account exists)",
              PasswordResetIn, status=202, auth=False),
    RouteSpec("POST", "/auth/password-reset/confirm", confirm_reset,
              "Set a new password with the emailed token; logs out everywhere",
              PasswordResetConfirmIn, status=204, auth=False),
    RouteSpec("PUT", "/me/password", change_password,
              "Change your password (every other session is revoked; a new one returned)",
              PasswordChangeIn, SessionOut),
    RouteSpec("PATCH", "/me", update_me, "Change your name", MeIn, MeOut),
    RouteSpec("GET", "/users", list_users, "Every user with their teams (operators)",
              answer=UsersOut, query=("limit", "cursor")),
]

__all__ = ["ROUTES", "send_reset"]
