"""Teams, members and roles, invitations.

Who may create a team is the operators' setting ``teams.creators``: platform
operators only (the default; anyone else gets 403 ``TEAM_CREATION_FORBIDDEN``),
or every user. A new team gets the GPU quotas of ``teams.default_gpus`` and
``teams.default_per_user_gpus`` (unset: unlimited); see ``_quotas.py``.

Who may do what: any member reads their team's members; owners and admins
change roles, remove members and invite; only an owner makes or touches an
owner. Anyone may leave a team (remove themselves) unless they are its last
owner. Someone outside a team gets 404 for it, as if it did not exist.

Owners and admins list the pending invitations and revoke them. An invitation
is accepted only by the address it was sent to: with a session, the session's
account must have that email; without one, the account created must (403
``WRONG_ACCOUNT`` otherwise), so a forwarded or leaked link lets no one else in.

Accepting checks the token before anything else: a token
that is no invitation answers 404 ``NOT_FOUND`` (``field: token``) the same
whatever the body and whether a session was sent, and counts as a token guess
of the client's address (``Limits.token_guess``, 429 ``THROTTLED`` past it);
no account is looked up, created or hashed for it. Only a live invitation's
holder learns whether its (own) address has an account (409).
"""

from __future__ import annotations

import datetime as dt

from starlette.requests import Request
from starlette.responses import Response

from .. import codes
from ..auth import hash_token, new_token
from ..email import EmailError, EmailKind, EmailMessage, send_with_retry
from ..model import Role
from ..team_rules import TeamCreators
from ._auth_routes import hash_new_password, open_session
from ._common import ApiError, Ctx, forbidden, ok, outranks, throttled
from ._models import (
    AcceptIn,
    AcceptOut,
    InvitationIn,
    InvitationListedOut,
    InvitationOut,
    InvitationsOut,
    MemberOut,
    MembershipOut,
    MembersOut,
    RoleIn,
    TeamIn,
    TeamInfoOut,
    TeamsOut,
    user_out,
)
from ._quotas import is_operator, team_info
from ._spec import RouteSpec


async def list_teams(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    store = ctx.services.store
    teams = await ctx.store(store.teams.of_user, session.user.id)
    quotas = await ctx.store(store.quotas.of_teams, [t.id for t, _ in teams])
    return ok(TeamsOut(teams=[team_info(t, r, quotas.get(t.id)) for t, r in teams]))


async def create_team(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    rules = ctx.services.teams
    if rules.creators is TeamCreators.OPERATORS and not await is_operator(ctx, session):
        raise ApiError(codes.TEAM_CREATION_FORBIDDEN, "on this platform only operators "
                       "create teams; ask a platform operator to create one for you and "
                       "invite you (operators: setting teams.creators=everyone lets every "
                       "user create teams)")
    body = await ctx.body(request, TeamIn)
    quota = rules.default_quota()
    team = await ctx.store(ctx.services.store.teams.create, name=body.name,
                           owner=session.user.id, now=ctx.now(), quota=quota)
    return ok(team_info(team, Role.OWNER, quota), 201)


async def list_members(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id = request.path_params["team"]
    await ctx.require_role(session, team_id, Role.MEMBER)
    members = await ctx.store(ctx.services.store.teams.members, team_id)
    return ok(MembersOut(members=[MemberOut(user=user_out(u), role=r) for u, r in members]))


async def _target_role(ctx: Ctx, team_id: str, user_id: str) -> Role:
    role = await ctx.store(ctx.services.store.teams.role_of, user_id, team_id)
    if role is None:
        raise ApiError(codes.NOT_FOUND, f"user {user_id} is not a member of team {team_id}")
    return role


async def change_role(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id, user_id = request.path_params["team"], request.path_params["user"]
    mine = await ctx.require_role(session, team_id, Role.ADMIN)
    body = await ctx.body(request, RoleIn)
    theirs = await _target_role(ctx, team_id, user_id)
    if not outranks(mine, theirs) or (body.role is Role.OWNER and mine is not Role.OWNER):
        raise forbidden("only an owner may make an owner or change an owner's role")
    membership = await ctx.store(ctx.services.store.teams.change_role, team_id, user_id, body.role)
    return ok(MembershipOut(user=membership.user, team=membership.team, role=membership.role))


async def remove_member(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id, user_id = request.path_params["team"], request.path_params["user"]
    if user_id != session.user.id:
        mine = await ctx.require_role(session, team_id, Role.ADMIN)
        if not outranks(mine, await _target_role(ctx, team_id, user_id)):
            raise forbidden("only an owner may remove an owner")
    else:
        await ctx.require_role(session, team_id, Role.MEMBER)
    await ctx.store(ctx.services.store.teams.remove_member, team_id, user_id)
    return ok()


async def invite(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id = request.path_params["team"]
    mine = await ctx.require_role(session, team_id, Role.ADMIN)
    body = await ctx.body(request, InvitationIn)
    if body.role is Role.OWNER and mine is not Role.OWNER:
        raise forbidden("only an owner may invite an owner")
    store = ctx.services.store
    team = await ctx.store(store.teams.get, team_id)
    token, token_hash = new_token()
    now = ctx.now()
    invitation = await ctx.store(
        store.invitations.create, team=team_id, email=body.email, role=body.role,
        token_hash=token_hash, invited_by=session.user.id, now=now,
        expires_at=now + ctx.services.lifetimes.invitation.total_seconds())
    link = f"{ctx.services.public_url.rstrip('/')}/accept?token={token}"
    message = EmailMessage(
        to=(invitation.email,), kind=EmailKind.INVITATION,
        subject=f"{session.user.name} invites you to {team.name} on CosmicAC",
        text=(f"{session.user.name} ({session.user.email}) invites you to join the team "
              f"{team.name} as {body.role.value}.\n\nAccept: {link}\n\nThe link works "
              f"until {_day(invitation.expires_at)} UTC and only once.\n"),
        idempotency_key=f"invitation-{invitation.id}")
    try:
        await send_with_retry(ctx.services.email, message)
    except EmailError as exc:
        await ctx.store(store.invitations.revoke, invitation.id)
        raise ApiError(codes.EMAIL_FAILED, f"the invitation email could not be sent "
                       f"({exc}); nothing was recorded; check the email settings and retry"
                       ) from None
    return ok(InvitationOut(id=invitation.id, team=team_id, email=invitation.email,
                            role=invitation.role, expires_at=invitation.expires_at), 201)


async def list_invitations(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id = request.path_params["team"]
    await ctx.require_role(session, team_id, Role.ADMIN)
    pending = await ctx.store(ctx.services.store.invitations.of_team, team_id,
                              pending_at=ctx.now())
    return ok(InvitationsOut(invitations=[InvitationListedOut(
        id=i.id, team=i.team, email=i.email, role=i.role, expires_at=i.expires_at,
        invited_by=i.invited_by, created_at=i.created_at) for i in pending]))


async def revoke_invitation(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id, invitation_id = request.path_params["team"], request.path_params["invitation"]
    await ctx.require_role(session, team_id, Role.ADMIN)
    store = ctx.services.store
    try:
        invitation = await ctx.store(store.invitations.get, invitation_id)
    except ApiError as exc:
        if exc.status != 404:
            raise
        invitation = None
    if invitation is None or invitation.team != team_id:
        raise ApiError(codes.NOT_FOUND, f"no invitation {invitation_id} in team {team_id}; "
                       "see GET /api/teams/{team}/invitations", "invitation")
    await ctx.store(store.invitations.revoke, invitation_id)
    return ok()


def _day(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M")


_NO_INVITATION = ("this is not an invitation link (mistyped, or revoked); ask the team's "
                  "owner or an admin for a new one")


async def accept(ctx: Ctx, request: Request) -> Response:
    """With a session: join as that user. Without: create the account, then join.

    The token is checked first, before the session, the fields or any account."""
    body = await ctx.body(request, AcceptIn)
    store = ctx.services.store
    token_hash = hash_token(body.token)
    guesses, source = ctx.throttle("token_guess"), ctx.client(request)
    wait = await guesses.wait_s("", source)
    if wait > 0:
        raise throttled(wait, "too many invitation links that were not valid from your "
                        "address", source)
    try:
        invitation = await ctx.store(store.invitations.pending, token_hash, now=ctx.now())
    except ApiError as exc:
        if exc.status in (404, 410):
            await guesses.failed("", source)
        if exc.status == 404:
            raise ApiError(codes.NOT_FOUND, _NO_INVITATION, "token") from None
        raise ApiError(exc.code, exc.message, "token", status=exc.status) from None
    if request.headers.get("authorization"):
        session = await ctx.session(request)
        membership = await ctx.store(store.invitations.accept, token_hash, session.user.id,
                                     now=ctx.now(), email=session.user.email)
        await guesses.succeeded("", source)
        return ok(AcceptOut(membership=MembershipOut(
            user=membership.user, team=membership.team, role=membership.role)))
    for field in ("email", "name", "password"):
        if not getattr(body, field):
            raise ApiError(codes.INVALID, f"{field} is required to create your account "
                           "(or send your session token to join as yourself)", field)
    assert body.email and body.name and body.password
    if body.email.strip().lower() != invitation.email:
        raise ApiError(codes.WRONG_ACCOUNT, "this invitation was sent to another email "
                       "address; create the account with that address", "email")
    try:
        await ctx.store(store.users.by_email, invitation.email)
    except ApiError as exc:
        if exc.status != 404:
            raise
    else:  # only the invitation's holder learns this, about the invited address
        raise ApiError(codes.CONFLICT, f"an account with email {invitation.email} exists "
                       "already; log in and accept with your session", "email")
    password_hash = await hash_new_password(ctx, body.password)
    user = await ctx.store(store.users.create, email=body.email, name=body.name,
                           password_hash=password_hash, now=ctx.now())
    try:
        membership = await ctx.store(store.invitations.accept, token_hash, user.id,
                                     now=ctx.now(), email=user.email)
    except ApiError:
        await ctx.store(store.users.delete, user.id)  # the account exists only to join
        raise
    await guesses.succeeded("", source)
    user = await ctx.store(store.users.get, user.id)
    return ok(AcceptOut(membership=MembershipOut(user=membership.user, team=membership.team,
                                                 role=membership.role),
                        session=await open_session(ctx, user)))


ROUTES = [
    RouteSpec("GET", "/teams", list_teams, "The caller's teams with their roles",
              answer=TeamsOut),
    RouteSpec("POST", "/teams", create_team, "Create a team the caller owns (operators, "
              "unless teams.creators=everyone)", TeamIn, TeamInfoOut, 201),
    RouteSpec("GET", "/teams/{team}/members", list_members, "The team's members (members)",
              answer=MembersOut),
    RouteSpec("PATCH", "/teams/{team}/members/{user}", change_role,
              "Change a member's role (owner/admin)", RoleIn, MembershipOut),
    RouteSpec("DELETE", "/teams/{team}/members/{user}", remove_member,
              "Remove a member (owner/admin), or leave", status=204),
    RouteSpec("POST", "/teams/{team}/invitations", invite,
              "Invite by email (owner/admin)", InvitationIn, InvitationOut, 201),
    RouteSpec("GET", "/teams/{team}/invitations", list_invitations,
              "Pending invitations (owner/admin)", answer=InvitationsOut),
    RouteSpec("DELETE", "/teams/{team}/invitations/{invitation}", revoke_invitation,
              "Revoke a pending invitation (owner/admin)", status=204),
    RouteSpec("POST", "/invitations/accept", accept,
              "Accept an invitation (with a session, or creating the account)", AcceptIn,
              AcceptOut, auth=False),
]

__all__ = ["ROUTES"]
