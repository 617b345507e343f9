"""The teams of an app-node with their memberships (who is in, with which role).

Invariant: every team has at least one owner. ``change_role``,
``remove_member`` and ``Users.delete`` refuse with :class:`LastOwner` instead
of breaking it; a team is created together with its owner.
"""

from __future__ import annotations

from ..errors import Conflict, LastOwner, NotFound
from ..model import Membership, Role, Team, TeamQuota, User
from ..model import check_text as _text
from ..model import parse_role as _role
from ._connection import Connection
from ._quotas import put_quota
from ._read_cache import MISS
from ._rows import _USER, _new_id, _user, team_row, user_row

__all__ = ["Teams", "check_not_last_owner", "insert_member", "insert_team"]


def insert_team(db: Connection, name: str, owner: str, now: float) -> Team:
    """Add a team owned by ``owner``, inside a write (also the first admin's team)."""
    name = _text("name", name, 64)
    if db.one("SELECT 1 FROM teams WHERE name = ?", (name,)) is not None:
        raise Conflict(f"a team named {name!r} exists already; choose another name")
    team = Team(id=_new_id(), name=name, created_at=now)
    db.execute("INSERT INTO teams (id, name, created_at) VALUES (?,?,?)",
               (team.id, team.name, team.created_at))
    db.execute("INSERT INTO memberships (user, team, role) VALUES (?,?,?)",
               (owner, team.id, Role.OWNER.value))
    db.execute(
        "UPDATE users SET active_team = ? WHERE id = ? AND active_team IS NULL",
        (team.id, owner))
    return team


def insert_member(db: Connection, team_id: str, user_id: str, role: Role) -> Membership:
    """Add a membership, inside a write (also when an invitation is accepted)."""
    team_row(db, team_id)
    user_row(db, user_id)
    if db.one("SELECT 1 FROM memberships WHERE user = ? AND team = ?",
              (user_id, team_id)) is not None:
        raise Conflict(f"user {user_id} is a member of team {team_id} already; "
                       "change their role instead")
    db.execute("INSERT INTO memberships (user, team, role) VALUES (?,?,?)",
               (user_id, team_id, role.value))
    db.execute(
        "UPDATE users SET active_team = ? WHERE id = ? AND active_team IS NULL",
        (team_id, user_id))
    return Membership(user=user_id, team=team_id, role=role)


def check_not_last_owner(db: Connection, team_id: str, user_id: str) -> None:
    """Raises LastOwner if ``user_id`` is the team's only owner (inside a read or write)."""
    (others,) = db.one(
        "SELECT COUNT(*) FROM memberships WHERE team = ? AND role = 'owner' AND user != ?",
        (team_id, user_id))
    if others == 0:
        raise LastOwner(f"user {user_id} is the last owner of team {team_id}; "
                        "make another member an owner first")


class Teams:
    """Teams and their memberships (``store.teams``). Blocking, thread-safe, each change atomic."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    def create(self, *, name: str, owner: str, now: float,
               quota: TeamQuota | None = None) -> Team:
        """A team with ``owner`` as its first owner (made their active team if they had none),
        with ``quota`` (None: unlimited) set in the same transaction.

        Raises: NotFound (owner), Conflict (the name is taken), Invalid.
        """
        with self._db.write():
            user_row(self._db, owner)
            team = insert_team(self._db, name, owner, now)
            if quota is not None:
                put_quota(self._db, team.id, quota)
            return team

    def get(self, team_id: str) -> Team:
        """Raises: NotFound."""
        with self._db.read():
            row = self._db.one("SELECT id, name, created_at FROM teams WHERE id = ?", (team_id,))
        if row is None:
            raise NotFound(f"no team {team_id}")
        return Team(*row)

    def all(self) -> list[Team]:
        """Every team, by name."""
        with self._db.read() as db:
            return [Team(*row) for row in db.execute(
                "SELECT id, name, created_at FROM teams ORDER BY name")]

    def rename(self, team_id: str, name: str) -> Team:
        """Raises: NotFound, Conflict (the name is taken), Invalid."""
        with self._db.write() as db:
            team_row(self._db, team_id)
            name = _text("name", name, 64)
            if self._db.one("SELECT 1 FROM teams WHERE name = ? AND id != ?",
                            (name, team_id)) is not None:
                raise Conflict(f"a team named {name!r} exists already; choose another name")
            db.execute("UPDATE teams SET name = ? WHERE id = ?", (name, team_id))
        return self.get(team_id)

    def delete(self, team_id: str) -> None:
        """Delete the team with its memberships, invitations and revoked key records.

        Raises:
            NotFound; Conflict: it still has live jobs or unrevoked API keys (delete
            and revoke them first, so nothing keeps running or billing unowned).
        """
        with self._db.write() as db:
            team_row(self._db, team_id)
            if self._db.one("SELECT 1 FROM jobs WHERE team = ? AND deleted_at IS NULL",
                            (team_id,)) is not None:
                raise Conflict("the team still has jobs; delete them first")
            if self._db.one("SELECT 1 FROM api_keys WHERE team = ? AND revoked_at IS NULL",
                            (team_id,)) is not None:
                raise Conflict("the team still has API keys; revoke them first")
            db.execute("DELETE FROM jobs WHERE team = ?", (team_id,))
            db.execute("DELETE FROM teams WHERE id = ?", (team_id,))

    def role_of(self, user_id: str, team_id: str) -> Role | None:
        """The user's role in the team; None: not a member (the API answers 403/404).
        (Kept: ``_read_cache.py``.)"""
        key = ("role", user_id, team_id)
        role = self._db.cache.get(key)
        if role is not MISS:
            return role
        with self._db.read():
            row = self._db.one("SELECT role FROM memberships WHERE user = ? AND team = ?",
                               (user_id, team_id))
            role = None if row is None else Role(row[0])
            self._db.cache.put(key, role)
        return role

    def add_member(self, team_id: str, user_id: str, role: Role | str) -> Membership:
        """Raises: NotFound (team or user), Conflict (already a member), Invalid (role)."""
        role = _role(role)
        with self._db.write():
            return insert_member(self._db, team_id, user_id, role)

    def change_role(self, team_id: str, user_id: str, role: Role | str) -> Membership:
        """Raises: NotFound (not a member), LastOwner (demoting the only owner), Invalid."""
        role = _role(role)
        with self._db.write() as db:
            current = self._member_role(team_id, user_id)
            if current is Role.OWNER and role is not Role.OWNER:
                check_not_last_owner(self._db, team_id, user_id)
            db.execute("UPDATE memberships SET role = ? WHERE user = ? AND team = ?",
                       (role.value, user_id, team_id))
        return Membership(user=user_id, team=team_id, role=role)

    def remove_member(self, team_id: str, user_id: str) -> None:
        """Raises: NotFound (not a member), LastOwner (the only owner)."""
        with self._db.write() as db:
            if self._member_role(team_id, user_id) is Role.OWNER:
                check_not_last_owner(self._db, team_id, user_id)
            db.execute("DELETE FROM memberships WHERE user = ? AND team = ?",
                       (user_id, team_id))
            db.execute("UPDATE users SET active_team = NULL WHERE id = ? AND active_team = ?",
                       (user_id, team_id))

    def members(self, team_id: str) -> list[tuple[User, Role]]:
        """The team's members with their roles, by email. Raises: NotFound (team)."""
        with self._db.read() as db:
            team_row(self._db, team_id)
            rows = db.execute(
                f"SELECT m.role, {', '.join('u.' + c.strip() for c in _USER.split(','))} "
                "FROM memberships m JOIN users u ON u.id = m.user WHERE m.team = ? "
                "ORDER BY u.email", (team_id,)).fetchall()
            return [(_user(row[1:]), Role(row[0])) for row in rows]

    def of_user(self, user_id: str) -> list[tuple[Team, Role]]:
        """The user's teams with their role in each, by name."""
        with self._db.read() as db:
            rows = db.execute(
                "SELECT t.id, t.name, t.created_at, m.role FROM memberships m "
                "JOIN teams t ON t.id = m.team WHERE m.user = ? ORDER BY t.name",
                (user_id,)).fetchall()
            return [(Team(*row[:3]), Role(row[3])) for row in rows]

    def shell_keys(self) -> dict[str, tuple[str, ...]]:
        """Every team's shell keys: its members' CLI keys (sorted, unique), leaving
        out disabled users; a team whose members have none maps to ``()``."""
        with self._db.read() as db:
            rows = db.execute(
                "SELECT t.id, u.cli_public_key FROM teams t "
                "LEFT JOIN memberships m ON m.team = t.id "
                "LEFT JOIN users u ON u.id = m.user AND u.disabled = 0 "
                "AND u.cli_public_key IS NOT NULL").fetchall()
        keys: dict[str, set[str]] = {}
        for team, key in rows:
            found = keys.setdefault(team, set())
            if key:
                found.add(key.lower())
        return {team: tuple(sorted(found)) for team, found in keys.items()}

    def _member_role(self, team_id: str, user_id: str) -> Role:
        row = self._db.one("SELECT role FROM memberships WHERE user = ? AND team = ?",
                           (user_id, team_id))
        if row is None:
            raise NotFound(f"user {user_id} is not a member of team {team_id}")
        return Role(row[0])
