"""Shell access follows team membership: app-node sends each team's shell keys to wrk-ork.

app-node is the truth of who may open shells on a team's container jobs: the
CLI keys of the team's members (disabled users left out). A job's spec carries
the keys as they were at its creation; from then on :class:`ShellKeySync`
keeps wrk-ork told (``teams.set_shell_keys``, :mod:`contracts.shell_access`),
and wrk-ork hands a changed set to the workers and they to the agents, which
close the sessions of keys that lost access.

How it stays right without hooks in every route that changes a membership,
a role, a CLI key or a user: every ``interval_s`` (and at once after
:meth:`ShellKeySync.nudge`) it reads every team's keys in one query, and sends
each team whose set differs from what it last sent, or that it has not sent
since it started. So a change by any route, or straight in the file, reaches
wrk-ork within ``interval_s``, and a send that failed (wrk-ork away) is tried
again on the next pass.

Versions: a set is sent with ``max(now in ns, last sent + 1)``; wrk-ork keeps a
set only if its version is above the one it holds. After an app-node restart
every team is sent once (wrk-ork takes the same keys at a newer version
without telling the racks). If wrk-ork holds a newer version than ours (the
clock went back), the set is sent again just above it: app-node is the truth.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from contracts.ork import SET_SHELL_KEYS
from contracts.shell_access import ShellKeys
from nodes.kit.ork_client import OrkClient, OrkUnavailable
from p2p.rpc import RpcError

from .errors import StoreError
from .store import Store

__all__ = ["DEFAULT_INTERVAL_S", "ShellKeySync"]

log = logging.getLogger(__name__)

#: How often every team's keys are compared with what was sent: the longest a
#: removed member keeps their shell, plus the hops after wrk-ork (a second or so).
DEFAULT_INTERVAL_S = 2.0


class ShellKeySync:
    """Keeps wrk-ork's copy of every team's shell keys equal to app-node's.

    Args:
        store: app-node's store (read in a thread).
        ork: the wrk-ork client.
        interval_s: the longest between two passes.
        clock_ns: the version source (tests pass a fake).
    """

    def __init__(self, store: Store, ork: OrkClient, *, interval_s: float = DEFAULT_INTERVAL_S,
                 clock_ns: Callable[[], int] = time.time_ns) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self.store = store
        self.ork = ork
        self.interval_s = interval_s
        self._clock_ns = clock_ns
        #: Per team, what wrk-ork acknowledged last.
        self.sent: dict[str, ShellKeys] = {}
        self._wake = trio.Event()
        #: Passes made, and sets wrk-ork took (for tests and statistics).
        self.passes = 0
        self.sends = 0

    def nudge(self) -> None:
        """Compare now (a route changed a membership or a CLI key)."""
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Pass after pass until cancelled; a failed pass is logged and retried."""
        task_status.started()
        while True:
            try:
                await self.sync_once()
            except (OrkUnavailable, RpcError, StoreError) as exc:
                code = getattr(exc, "code", type(exc).__name__)
                log.warning("app_node.shell_keys_unsynced code=%s reason=%s", code, exc)
            with trio.move_on_after(self.interval_s):
                await self._wake.wait()
            self._wake = trio.Event()

    async def sync_once(self) -> int:
        """Send every team whose keys differ from what wrk-ork acknowledged.

        Returns:
            How many teams were sent.

        Raises:
            OrkUnavailable, RpcError: wrk-ork could not be told (the teams not
                sent yet are sent on the next pass).
            StoreError: the store could not be read.
        """
        current = await trio.to_thread.run_sync(self.store.teams.shell_keys)
        self.passes += 1
        sent = 0
        for team, keys in sorted(current.items()):
            last = self.sent.get(team)
            if last is not None and last.keys == keys:
                continue
            version = max(self._clock_ns(), 0 if last is None else last.version + 1)
            try:
                update = ShellKeys(team=team, keys=keys, version=version)
            except ValueError as exc:  # over MAX_SHELL_KEYS: say so, keep the others going
                log.error("app_node.shell_keys_invalid team=%s keys=%d reason=%s", team,
                          len(keys), str(exc).splitlines()[0])
                continue
            ack = await self.ork.call(SET_SHELL_KEYS, update)
            if not ack.applied:
                # wrk-ork holds this version or a newer one; app-node is the truth.
                update = update.model_copy(update={"version": max(ack.version, version) + 1})
                ack = await self.ork.call(SET_SHELL_KEYS, update)
            if not ack.applied:  # raced again: the next pass tries afresh
                log.warning("app_node.shell_keys_refused team=%s version=%d held=%d", team,
                            update.version, ack.version)
                continue
            self.sent[team] = update
            sent += 1
            self.sends += 1
            log.info("app_node.shell_keys team=%s version=%d keys=%d%s", team, ack.version,
                     len(keys), "" if last is not None else " first=1")
        for team in set(self.sent) - set(current):
            del self.sent[team]  # deleted: it has no jobs left (delete_team refuses otherwise)
        return sent
