"""Who may call wrk-ork: the roles of its callers' keys (DESIGN.md §5, least privilege).

wrk-ork's callers are daemons, each with its own key and its own needs:

- **app-node** (setting ``app_nodes``): every control method; it is the only
  daemon that acts for users, after checking their team and role.
- **proxy-inference** (setting ``proxies``): reads the jobs and follows their
  changes (``jobs.get``, ``jobs.list``, ``jobs.watch``) to route inference;
  it faces the internet, so it may change nothing.
- **a worker** (a registered rack's key): calls no method of
  ``cosmicac-ork/1``; it speaks only ``cosmicac-mq/1``, where wrk-ork keeps a
  queue for each registered rack's key and closes every other channel.

Which methods each role may call is the table in :mod:`.service`
(``ACCESS``); a method it does not list is refused to everyone. A key with no
role (a stranger, or every key when the allow-lists are empty) is refused
everything: an empty allow-list never opens wrk-ork up.

The old single allow-list ``clients`` still works: its keys get the app-node
role, with a warning (it gave them every method, so that is what they keep
until the operator splits it into ``app_nodes`` and ``proxies``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["OrkAccess", "Role"]


class Role(StrEnum):
    """What a caller of wrk-ork is."""

    #: app-node: every control method.
    APP_NODE = "app-node"
    #: proxy-inference: reads and follows jobs.
    PROXY = "proxy"
    #: A registered rack's worker: the queue only, no method of cosmicac-ork/1.
    WORKER = "worker"


@dataclass(frozen=True)
class OrkAccess:
    """The roles of keys, from wrk-ork's settings and its registered racks.

    Args:
        app_nodes: keys with the app-node role.
        proxies: keys with the proxy role.
        is_rack: ``is_rack(key)``: a registered rack's worker (the daemon's
            queues know); only named in refusals, it opens no method.
    """

    app_nodes: frozenset[bytes] = frozenset()
    proxies: frozenset[bytes] = frozenset()
    is_rack: Callable[[bytes], bool] = lambda key: False

    @classmethod
    def from_settings(cls, *, app_nodes: Iterable[bytes] = (), proxies: Iterable[bytes] = (),
                      clients: Iterable[bytes] = (),
                      is_rack: Callable[[bytes], bool] = lambda key: False) -> OrkAccess:
        """The roles the settings give; ``clients`` (deprecated) count as app-nodes."""
        return cls(frozenset(app_nodes) | frozenset(clients), frozenset(proxies), is_rack)

    @property
    def empty(self) -> bool:
        """No key may call anything (the daemon warns: it refuses every call)."""
        return not self.app_nodes and not self.proxies

    def roles_of(self, key: bytes) -> frozenset[Role]:
        roles = set()
        if key in self.app_nodes:
            roles.add(Role.APP_NODE)
        if key in self.proxies:
            roles.add(Role.PROXY)
        if self.is_rack(key):
            roles.add(Role.WORKER)
        return frozenset(roles)
