"""Who may call which method: roles per method, checked before a call is routed.

A service that several kinds of peer call (wrk-ork: app-node, proxy-inference)
names, per method, the roles that may call it, and how a caller's proven key
maps to roles. Given to a router (``Router(guard=access.check)``), the check
runs on every request before anything else is done with it (before its
method is looked up and its params read), so:

- a caller holding none of a method's roles gets ``FORBIDDEN``;
- a method the table does not list gets ``FORBIDDEN`` from everyone, whether
  or not the router serves it: a method added to the router and forgotten in
  the table is closed, not open (least privilege by default);
- a caller with no proven key (an in-memory channel) has no role;
- a key with no role at all (a stranger, or every key when the allow-lists
  are empty) is refused everything: an empty allow-list never opens up.

The table is plain data (method name -> roles), so a service's README and its
table test can read it; adding a method is one line. Refusals are counted
per method (:meth:`AccessTable.statistics`) and logged, once per caller and
method (a bounded memory of who was logged, so a flood logs little).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from p2p.keys import format_key
from p2p.rpc._errors import RpcError

__all__ = ["FORBIDDEN", "AccessStatistics", "AccessTable", "Guard"]

log = logging.getLogger(__name__)

#: The code of a refused call.
FORBIDDEN = "FORBIDDEN"
#: ``guard(method, remote_public_key)``: returns to admit the call, raises
#: :class:`RpcError` to answer it with that error instead.
Guard = Callable[[str, "bytes | None"], None]
#: Refusals of methods the table does not list are counted under this name
#: (a caller chooses the names: they must not grow the counters).
UNLISTED = "(unlisted)"
#: (caller, method) pairs whose refusal was logged; cleared when full, so a
#: flood of refusals logs at most this many lines before repeating.
MAX_LOGGED = 1024


@dataclass(frozen=True, slots=True)
class AccessStatistics:
    """Refused calls by method (``(unlisted)`` for methods the table does not name)."""

    refused: Mapping[str, int]


class AccessTable:
    """Roles per method, and the caller's roles by key.

    Args:
        service: the service's name, for messages and logs (``wrk-ork``).
        table: method name -> the roles that may call it.
        roles_of: ``roles_of(key) -> roles`` of a caller's proven key (empty:
            none). Called on every request: keep it a set lookup.
        hint: what the operator should do for a key with no role (it ends the
            refusal's message), e.g. ``"list it in wrk-ork's app_nodes"``; or
            ``hint(roles)`` of the roles the refused method is for, where each
            role is a setting of its own (``"add it to wrk-monitor's proxies"``).
    """

    def __init__(self, service: str, table: Mapping[str, Iterable[str]],
                 roles_of: Callable[[bytes], Collection[str]], *,
                 hint: str | Callable[[frozenset[str]], str] = "") -> None:
        self.service = service
        self.table: Mapping[str, frozenset[str]] = MappingProxyType(
            {method: frozenset(roles) for method, roles in table.items()})
        self._roles_of = roles_of
        self._hint = hint
        self._refused: dict[str, int] = {}
        self._logged: set[tuple[bytes | None, str]] = set()

    def roles(self, key: bytes | None) -> frozenset[str]:
        """The roles of a caller's key (none without a proven key)."""
        return frozenset() if key is None else frozenset(self._roles_of(key))

    def allowed(self, method: str, key: bytes | None) -> bool:
        """True if ``key`` holds one of the roles ``method`` is open to."""
        return not self.roles(key).isdisjoint(self.table.get(method, ()))

    def check(self, method: str, key: bytes | None) -> None:
        """The router's guard: return if the call is allowed.

        Raises:
            RpcError: ``FORBIDDEN``, saying which roles the method is for and
                what the caller is.
        """
        roles = self.roles(key)
        wanted = self.table.get(method)
        if wanted is not None and not roles.isdisjoint(wanted):
            return
        counted = method if wanted is not None else UNLISTED
        self._refused[counted] = self._refused.get(counted, 0) + 1
        caller = "a caller with no proven key" if key is None else f"key {format_key(key)}"
        if wanted is None or not wanted:
            why = f"{self.service} serves {method[:64]!r} to nobody"
        elif roles:
            why = (f"{method} is for {_names(wanted)} only; {caller} is "
                   f"{_names(roles)}")
        else:
            hint = self._hint(wanted) if callable(self._hint) else self._hint
            why = f"{caller} has no role at {self.service}" + (f" ({hint})" if hint else "")
        # A name the table does not know is the caller's text: quoted and cut.
        self._log(key, method if wanted is not None else repr(method[:64]), roles)
        raise RpcError(FORBIDDEN, why)

    def statistics(self) -> AccessStatistics:
        return AccessStatistics(refused=dict(self._refused))

    def _log(self, key: bytes | None, method: str, roles: frozenset[str]) -> None:
        if (key, method) in self._logged:
            log.debug("rpc.forbidden service=%s method=%s caller=%s", self.service, method,
                      "-" if key is None else format_key(key)[:16])
            return
        if len(self._logged) >= MAX_LOGGED:
            self._logged.clear()
        self._logged.add((key, method))
        log.warning("rpc.forbidden service=%s method=%s caller=%s roles=%s", self.service,
                    method, "-" if key is None else format_key(key)[:16],
                    ",".join(sorted(roles)) or "none")


def _names(roles: Iterable[str]) -> str:
    return " or ".join(sorted(roles))
