"""The worker's side of its agents' reports: who each agent is, and whether it is alive.

The worker derives a replica's status from two sources: what the backend
says of the VMI (or process), and what the VMI's agent says of itself.
This module is the second source. It serves ``cosmicac-agent/1``
(:mod:`contracts.agent_report`) on the worker's swarm and turns the calls into
:class:`AgentEvent`: ``hello`` (the agent connected and proved which VMI it
is), ``ready``, ``failed`` (the agent gave up), and ``silent`` when an agent
that had said hello stops reporting for ``silent_after_s`` (three missed
heartbeats by default): the replica is then Unknown.

Two layers, as everywhere in the house (STYLE.md):

- :class:`AgentTable`, the I/O-free core: the VMIs the worker expects, each
  with its report token, the key bound to it, and the time of its last
  report. Calls take ``now`` and return events; :meth:`AgentTable.expire`
  and :meth:`AgentTable.next_deadline` do the timing.
- :class:`AgentRegistry`, the trio driver: the RPC service, the events
  channel and the task that wakes at the next deadline.

Invariants: a key is bound to at most one VMI and a VMI to at most one key;
only a hello with the VMI's token binds (its SHA-256 compared in constant time:
the worker keeps no token, see :mod:`.store`); every other call is authorised
by the bound key alone.

Takeover: a token proves the VMI, not that the caller is its only
agent, and a token can leak (read from a VMI's disk or an old config). So a
hello with the right token from a *new* key is decided by :func:`decide` on the
bound agent's state: refused with ``ALREADY_BOUND`` while the bound agent is
alive (its key connected to the worker, or a report within its silence window),
and logged as a warning naming the VMI and both keys; accepted once it is gone
(not connected and silent past the window), and that rebind is logged too. The
victim keeps its binding, so its requests and answers stay its own.

The table holds one entry per VMI the worker expects (the worker's own bound),
and nothing for callers that fail hello, so a stranger cannot grow it.

Logs: ``agent.logs`` carries the agent's log records. The
registry authorises the call by the bound key (``NOT_INTRODUCED`` otherwise),
decodes the batch (``BAD_BATCH`` for one that does not decode: refused
whole, counted, never a crash), re-stamps every record with the bound VMI's
job id and replica and ``service`` with the agent's kind
(:func:`contracts.agent_report.agent_service`), so an agent can only ever
write its own replica's logs, and hands the records to ``on_logs`` (the
worker's log shipper's ``offer_many``: synchronous, never blocks). Without
``on_logs`` (the worker's telemetry is off) batches are checked, answered and
discarded. A log batch is not a report: it does not move the silence deadline,
so an agent whose reports stopped is silent even while its logs still arrive.
Each agent's records are limited (:mod:`.log_limit`): a token bucket per VMI
(``agents.log_rate_per_s``, ``agents.log_burst``), so a chatty agent cannot push
the worker's own System records and the other agents' out of the shipper's
drop-oldest queue. Records over the budget are dropped here (the first ones of a
cut batch are kept), counted per job and said in one warning line per agent a
minute at most; the call is still answered (``accepted`` = the records kept),
never refused, so the agent's session goes on. A new hello from the same VMI
keeps its bucket (a restarting agent gets no fresh burst); forgetting the VMI
drops it.

Metrics: a heartbeat may carry the agent's figures
(``Heartbeat.metrics``, bounded by the contract). The table keeps the latest
per VMI and :meth:`AgentTable.agent_metrics` lists them labelled with the
entry's job id, replica, node rank and service (the trust model of logs: the
bound key says which VMI, the agent's claims say nothing); a new hello, a
silence and :meth:`AgentTable.forget` drop them. The worker's
:mod:`.agent_metrics` reporter forwards them to wrk-monitor.

Shell keys: ``agent.shell_keys`` is a container agent's long poll
for its team's shell keys (:mod:`contracts.shell_access`). The registry
authorises it by the bound key (``NOT_INTRODUCED`` otherwise), so an agent
only ever learns its own job's team's keys, and asks :attr:`AgentRegistry.shell_keys`
(the worker's ``wait_shell_keys``) for the VMI the key is bound to; a VMI of
no container job gets ``NO_SHELL``. Not a report: it moves no deadline.

State is in memory: after a worker restart the worker calls :meth:`expect`
again for every VMI it knows (the persisted replicas), and the agents, whose
connections broke, say hello again on their next connection.
"""

from __future__ import annotations

import enum
import hmac
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import trio

from contracts.agent_report import (
    FAILED,
    HEARTBEAT,
    HELLO,
    LOGS,
    PROTOCOL,
    READY,
    UNREADY,
    Ack,
    Heartbeat,
    Hello,
    HelloResult,
    Report,
    ReportCode,
    agent_service,
)
from contracts.monitor import (
    HEARD_AGE,
    MAX_AGENT_VALUES,
    AgentMetrics,
    BadBatch,
    LogRecord,
    PushBatch,
    PushResult,
    decode_batch,
)
from contracts.shell_access import SHELL_KEYS, ShellKeys, ShellKeysWait
from p2p.host import RpcService
from p2p.keys import format_key
from p2p.rpc import CallContext, Router, RpcError

from .backend import VmiSpec, token_digest, vmi_name
from .log_limit import DEFAULT_LOG_LIMIT, LogLimit, LogLimiter

__all__ = [
    "AgentEvent",
    "AgentEventKind",
    "AgentRefused",
    "AgentRegistry",
    "AgentState",
    "AgentTable",
    "BoundAgent",
    "HelloDecision",
    "HelloOutcome",
    "OnLogs",
    "TakenLogs",
    "decide",
]

log = logging.getLogger(__name__)

#: Heartbeats an agent may miss before it is reported silent. Kubernetes
#: marks a node NotReady after 40 s of 10 s leases (4); 3 keeps Unknown quick.
DEFAULT_SILENT_HEARTBEATS = 3

#: Where an agent's re-stamped log records go: synchronous, must never block
#: (the worker's ``LogShipper.offer_many``).
OnLogs = Callable[[Sequence[LogRecord]], None]
#: ``await shell_keys(vmi, version, wait_s)``: the VMI's team's shell keys once
#: their version is not ``version`` (or after ``wait_s``); None: not a container VMI.
ShellKeysSource = Callable[[str, int, float], Awaitable[ShellKeys | None]]


class AgentEventKind(enum.StrEnum):
    """What an agent's reports (or their absence) said about its VMI."""

    #: The agent connected and proved which VMI it is; not ready yet. Also
    #: sent when a silent agent that had not said ready reports again.
    HELLO = "hello"
    #: The agent serves. Also sent when a silent, ready agent reports again.
    READY = "ready"
    #: The agent gave up: its workload cannot run.
    FAILED = "failed"
    #: No report for ``silent_after_s``: the replica is Unknown.
    SILENT = "silent"


@dataclass(frozen=True)
class AgentEvent:
    """One change in what the worker knows from a VMI's agent."""

    vmi_name: str
    kind: AgentEventKind
    #: The agent's own words (ready, failed), or the registry's ("no report
    #: for 15 s"); a System log line.
    message: str = ""
    #: ``trio.current_time()`` when it happened (stamp wall time yourself).
    at: float = 0.0


@dataclass(frozen=True)
class AgentState:
    """A snapshot of one expected VMI's agent."""

    vmi_name: str
    generation: int
    #: The public key bound by the last successful hello, or None.
    key: bytes | None
    ready: bool
    failed: bool
    silent: bool
    #: trio time of the last report (hello, ready, failed, heartbeat), or None.
    last_report_at: float | None


@dataclass(frozen=True)
class TakenLogs:
    """One ``agent.logs`` batch after the agent's budget (:meth:`AgentTable.take_logs`)."""

    vmi_name: str
    job_id: str
    replica: int
    #: The records kept (the batch's first ones), re-stamped.
    records: list[LogRecord]
    #: Records of the batch dropped by the budget.
    dropped: int = 0
    #: A warning line to log now (at most one per agent a minute), or None.
    warning: str | None = None


class AgentRefused(Exception):
    """A report was refused; ``code`` is a :class:`ReportCode` (crosses the wire).

    ``bound_key``: for ``ALREADY_BOUND``, the live agent's key (for the worker's
    log, not the caller's answer)."""

    def __init__(self, code: ReportCode, message: str, *,
                 bound_key: bytes | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.bound_key = bound_key


class HelloDecision(enum.StrEnum):
    """What a hello that proved its VMI (token and generation) does to the binding."""

    #: No key is bound: bind the caller.
    BIND = "bind"
    #: The bound key again (its agent reconnected): keep it.
    RENEW = "renew"
    #: Another key was bound and its agent is gone: the caller takes the VMI (logged).
    REBIND = "rebind"
    #: Another key is bound and its agent is alive: ``ALREADY_BOUND`` (logged).
    REFUSE = "refuse"


@dataclass(frozen=True)
class BoundAgent:
    """The VMI's binding as :func:`decide` sees it."""

    #: The bound key, or None.
    key: bytes | None
    #: The bound key has a connection to the worker now.
    connected: bool
    #: trio time of its last report (hello, ready, failed, heartbeat), or None.
    last_report: float | None
    #: The silence window: reports older than this say nothing of life.
    silent_after_s: float

    def alive(self, now: float) -> bool:
        """Connected, or heard from within the window."""
        if self.key is None:
            return False
        return self.connected or (self.last_report is not None
                                  and now - self.last_report < self.silent_after_s)


def decide(bound: BoundAgent, key: bytes, now: float) -> HelloDecision:
    """Whether ``key``, whose hello proved the VMI, may bind it (pure)."""
    if bound.key is None:
        return HelloDecision.BIND
    if hmac.compare_digest(bound.key, key):
        return HelloDecision.RENEW
    return HelloDecision.REFUSE if bound.alive(now) else HelloDecision.REBIND


class HelloOutcome(NamedTuple):
    """A successful hello: the VMI bound, the events, and how."""

    name: str
    events: list[AgentEvent]
    decision: HelloDecision
    #: For ``REBIND``: the key the VMI was bound to before.
    replaced: bytes | None = None


@dataclass
class _Entry:
    name: str
    job_id: str
    replica: int
    node_rank: int
    generation: int
    #: The SHA-256 of the VMI's report token (hex, ASCII): the token is not kept.
    token_sha256: bytes
    silent_after_s: float
    #: The ``service`` of this agent's log records (``agent-inference``...).
    service: str = "agent"
    key: bytes | None = None
    ready: bool = False
    failed: bool = False
    silent: bool = False
    last_report: float | None = None
    #: The figures of the agent's latest heartbeat (validated by the contract).
    metrics: dict[str, float] | None = None

    @property
    def slot(self) -> tuple[str, int, int]:
        return self.job_id, self.replica, self.node_rank

    @property
    def deadline(self) -> float | None:
        """When this agent is silent unless it reports; None when not timed."""
        if self.key is None or self.failed or self.silent or self.last_report is None:
            return None
        return self.last_report + self.silent_after_s


class AgentTable:
    """The I/O-free core: expected VMIs, bound keys, last reports, silence.

    Args:
        silent_after_s: silence after which an agent is reported silent; None:
            ``silent_heartbeats`` times the VMI's ``heartbeat_interval_s``.
        silent_heartbeats: heartbeats missed before silence, when
            ``silent_after_s`` is None.
        log_limit: each agent's log budget for :meth:`take_logs`; None: unlimited.
    """

    def __init__(self, *, silent_after_s: float | None = None,
                 silent_heartbeats: int = DEFAULT_SILENT_HEARTBEATS,
                 log_limit: LogLimit | None = None) -> None:
        if silent_after_s is not None and not silent_after_s > 0:
            raise ValueError("silent_after_s must be positive")
        if silent_heartbeats < 1:
            raise ValueError("silent_heartbeats must be at least 1")
        self.silent_after_s = silent_after_s
        self.silent_heartbeats = silent_heartbeats
        self._entries: dict[str, _Entry] = {}
        self._by_slot: dict[tuple[str, int, int], _Entry] = {}
        self._by_key: dict[bytes, _Entry] = {}
        #: The agents' log buckets and drop counts; None: no limit.
        self.log_limiter = LogLimiter(log_limit) if log_limit is not None else None

    def __len__(self) -> int:
        return len(self._entries)

    # -- what the worker says ------------------------------------------------------------

    def expect(self, vmi: VmiSpec) -> None:
        """Expect ``vmi``'s agent. Again with the same generation and token: no change
        (so re-expecting after an adopt keeps a live binding); otherwise the old
        binding and state are dropped (a restart's new VMI must say hello). Only the
        token's digest is kept (:attr:`VmiSpec.expected_token`)."""
        config = vmi.agent
        token = vmi.expected_token.encode()
        old = self._entries.get(vmi.name)
        if (old is not None and old.generation == config.generation
                and hmac.compare_digest(old.token_sha256, token)):
            return
        if old is not None:
            self.forget(vmi.name)
        slot_owner = self._by_slot.get((config.job_id, config.replica, config.node_rank))
        if slot_owner is not None:  # the same replica slot under another name
            self.forget(slot_owner.name)
        silent_after = (self.silent_after_s if self.silent_after_s is not None
                        else self.silent_heartbeats * config.heartbeat_interval_s)
        entry = _Entry(vmi.name, config.job_id, config.replica, config.node_rank,
                       config.generation, token, silent_after,
                       agent_service(config.job_type))
        self._entries[vmi.name] = entry
        self._by_slot[entry.slot] = entry

    def forget(self, name: str) -> None:
        """Stop expecting VMI ``name`` (deleted); its key is unbound. Unknown: no-op."""
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        self._by_slot.pop(entry.slot, None)
        if entry.key is not None and self._by_key.get(entry.key) is entry:
            del self._by_key[entry.key]
        if self.log_limiter is not None:
            self.log_limiter.forget(name)

    def state(self, name: str) -> AgentState | None:
        entry = self._entries.get(name)
        if entry is None:
            return None
        return AgentState(entry.name, entry.generation, entry.key, entry.ready, entry.failed,
                          entry.silent, entry.last_report)

    def names(self) -> list[str]:
        return list(self._entries)

    # -- what the agents say -------------------------------------------------------------

    def hello(self, key: bytes, hello: Hello, now: float, *,
              connected: Callable[[bytes], bool] | None = None) -> HelloOutcome:
        """Bind ``key`` to the VMI ``hello`` names, if its token is that VMI's.

        Args:
            connected: whether a key has a connection to the worker now (the
                swarm's); None: no connection is known, the reports' times decide.

        Returns:
            The VMI's name, the events to emit, and how it was bound (see
            :func:`decide`; the key it replaced, for a rebind).

        Raises:
            AgentRefused: ``UNKNOWN_REPLICA``, ``FORBIDDEN``, ``STALE_GENERATION``,
                or ``ALREADY_BOUND`` (another key's agent is alive; nothing changes).
        """
        entry = self._by_slot.get((hello.job_id, hello.replica, hello.node_rank))
        # Compare even when there is no entry, so timing does not tell which
        # slots exist before the token is checked.
        expected = entry.token_sha256 if entry is not None else b"0" * 64
        token_ok = hmac.compare_digest(expected, token_digest(hello.token).encode())
        if entry is None:
            raise AgentRefused(ReportCode.UNKNOWN_REPLICA,
                               f"no VMI expected for job {hello.job_id} replica "
                               f"{hello.replica} node {hello.node_rank}")
        if not token_ok:
            raise AgentRefused(ReportCode.FORBIDDEN, f"wrong report token for {entry.name}")
        if hello.generation != entry.generation:
            raise AgentRefused(ReportCode.STALE_GENERATION,
                               f"{entry.name} is at generation {entry.generation}, "
                               f"not {hello.generation}")
        bound = BoundAgent(entry.key, entry.key is not None and connected is not None
                           and connected(entry.key), entry.last_report, entry.silent_after_s)
        decision = decide(bound, key, now)
        if decision is HelloDecision.REFUSE:
            raise AgentRefused(ReportCode.ALREADY_BOUND,
                               f"{entry.name} is bound to another agent, which is alive",
                               bound_key=entry.key)
        replaced = entry.key if decision is HelloDecision.REBIND else None
        previous = self._by_key.pop(key, None)
        if previous is not None and previous is not entry:
            previous.key = None  # one key, one VMI: the token proved this one
        if entry.key is not None and entry.key != key:
            self._by_key.pop(entry.key, None)
        entry.key = key
        self._by_key[key] = entry
        entry.ready = entry.failed = entry.silent = False
        entry.last_report = now
        entry.metrics = None  # maybe another agent process: its figures start afresh
        message = f"agent {format_key(key)[:12]} connected"
        if replaced is not None:
            message += f", replacing agent {format_key(replaced)[:12]} (gone)"
        return HelloOutcome(entry.name, [AgentEvent(entry.name, AgentEventKind.HELLO,
                                                    message, now)], decision, replaced)

    def ready(self, key: bytes, message: str, now: float) -> list[AgentEvent]:
        entry = self._reporting(key, now)
        entry.ready, entry.failed = True, False
        return [AgentEvent(entry.name, AgentEventKind.READY, message, now)]

    def unready(self, key: bytes, message: str, now: float) -> list[AgentEvent]:
        """The agent stopped serving for a while: its VMI is starting again."""
        entry = self._reporting(key, now)
        entry.ready = False
        return [AgentEvent(entry.name, AgentEventKind.HELLO, message, now)]

    def failed(self, key: bytes, message: str, now: float) -> list[AgentEvent]:
        entry = self._reporting(key, now)
        entry.ready, entry.failed = False, True
        return [AgentEvent(entry.name, AgentEventKind.FAILED, message, now)]

    def heartbeat(self, key: bytes, now: float,
                  metrics: dict[str, float] | None = None) -> list[AgentEvent]:
        """A heartbeat; ``metrics`` (``Heartbeat.metrics``, non-empty) replace the
        VMI's figures, an empty beat keeps the previous ones."""
        was_silent = self._by_key[key].silent if key in self._by_key else False
        entry = self._reporting(key, now)
        if metrics:
            entry.metrics = dict(metrics)
        if not was_silent or entry.failed:
            return []
        kind = AgentEventKind.READY if entry.ready else AgentEventKind.HELLO
        return [AgentEvent(entry.name, kind, "agent reports again", now)]

    def logs(self, key: bytes, batch: bytes) -> list[LogRecord]:
        """The records of ``batch`` (``agent.logs``) from the agent bound to ``key``,
        re-stamped with its VMI's job id, replica and service (time, source, level
        and text kept). Not a report: the silence deadline does not move.

        Raises:
            AgentRefused: ``NOT_INTRODUCED`` if ``key`` is bound to no VMI (checked
                first: a stranger's batch is not worth decoding); ``BAD_BATCH``
                if ``batch`` is not valid records (never another exception).
        """
        return self._stamped(self._logging(key), batch)

    def take_logs(self, key: bytes, batch: bytes, now: float) -> TakenLogs:
        """:meth:`logs`, then the agent's budget at ``now``: the batch's first
        records within it are kept, the rest dropped and counted (see
        :mod:`.log_limit`). Without a ``log_limit`` every record is kept.

        Raises:
            AgentRefused: as :meth:`logs` (a refused batch spends no budget).
        """
        entry = self._logging(key)
        records = self._stamped(entry, batch)
        if self.log_limiter is None or not records:
            return TakenLogs(entry.name, entry.job_id, entry.replica, records)
        admission = self.log_limiter.admit(entry.name, entry.job_id, len(records), now)
        return TakenLogs(entry.name, entry.job_id, entry.replica, records[:admission.kept],
                         admission.dropped, admission.warning)

    def bound(self, key: bytes) -> str | None:
        """The name of the VMI ``key`` is bound to, or None."""
        entry = self._by_key.get(key)
        return None if entry is None else entry.name

    def _logging(self, key: bytes) -> _Entry:
        entry = self._by_key.get(key)
        if entry is None:
            raise AgentRefused(ReportCode.NOT_INTRODUCED,
                               "say hello first: this key is bound to no VMI")
        return entry

    @staticmethod
    def _stamped(entry: _Entry, batch: bytes) -> list[LogRecord]:
        try:
            records = decode_batch(batch)
        except BadBatch as exc:
            raise AgentRefused(ReportCode.BAD_BATCH, str(exc)) from None
        job_id, replica, service = entry.job_id, entry.replica, entry.service
        return [LogRecord(r.time_ns, job_id, replica, r.source, r.level, service, r.text)
                for r in records]

    def agent_metrics(self) -> list[AgentMetrics]:
        """The latest figures of every bound, reporting agent, labelled with its
        VMI's job id, replica, node rank and service (silent ones left out: their
        figures are stale)."""
        return [AgentMetrics(job_id=e.job_id, replica=e.replica, node_rank=e.node_rank,
                             service=e.service, values=e.metrics)
                for e in self._entries.values()
                if e.metrics and e.key is not None and not e.silent]

    def agent_report(self, now: float) -> list[AgentMetrics]:
        """What the worker sends wrk-monitor: every agent that said hello, with its
        latest figures (when not silent) and :data:`~contracts.monitor.HEARD_AGE`,
        the seconds since it was last heard from (silent ones too: that age is the
        symptom a job's "last heard" shows)."""
        out = []
        for e in self._entries.values():
            if e.key is None or e.last_report is None:
                continue
            figures = {} if e.silent or not e.metrics else dict(
                list(e.metrics.items())[:MAX_AGENT_VALUES - 1])
            figures[HEARD_AGE] = max(0.0, now - e.last_report)
            out.append(AgentMetrics(job_id=e.job_id, replica=e.replica,
                                    node_rank=e.node_rank, service=e.service, values=figures))
        return out

    def _reporting(self, key: bytes, now: float) -> _Entry:
        entry = self._by_key.get(key)
        if entry is None:
            raise AgentRefused(ReportCode.NOT_INTRODUCED,
                               "say hello first: this key is bound to no VMI")
        entry.last_report = now
        entry.silent = False
        return entry

    # -- time ----------------------------------------------------------------------------

    def expire(self, now: float) -> list[AgentEvent]:
        """Agents whose last report is ``silent_after_s`` old: ``silent`` (once each)."""
        events = []
        for entry in self._entries.values():
            deadline = entry.deadline
            if deadline is not None and deadline <= now:
                entry.silent = True
                entry.metrics = None
                events.append(AgentEvent(
                    entry.name, AgentEventKind.SILENT,
                    f"no report from the agent for {now - entry.last_report:.1f} s", now))
        return events

    def next_deadline(self) -> float | None:
        """When :meth:`expire` may next have something to say; None: nothing is timed."""
        deadlines = [d for e in self._entries.values() if (d := e.deadline) is not None]
        return min(deadlines, default=None)


class AgentRegistry:
    """The worker's agent service: ``cosmicac-agent/1`` plus silence detection.

    Args:
        events: where :class:`AgentEvent` go. Bounded by its buffer: a worker
            that stops reading makes the agents' calls wait (and time out on
            their side, to be retried), it does not grow memory.
        silent_after_s: see :class:`AgentTable`.
        silent_heartbeats: see :class:`AgentTable`.
        on_logs: where the agents' re-stamped log records go (see the module
            doc); None: telemetry is off, batches are checked and discarded.
        log_limit: each agent's log budget (:mod:`.log_limit`; the defaults
            unless given); None: unlimited.

    Add :attr:`service` to the worker's swarm, start :meth:`run` in a nursery,
    and call :meth:`expect` for each VMI before (or as) it is created::

        registry = AgentRegistry(send)
        swarm.add_service(registry.service)
        await nursery.start(registry.run)
    """

    def __init__(self, events: trio.MemorySendChannel[AgentEvent], *,
                 silent_after_s: float | None = None,
                 silent_heartbeats: int = DEFAULT_SILENT_HEARTBEATS,
                 on_logs: OnLogs | None = None,
                 log_limit: LogLimit | None = DEFAULT_LOG_LIMIT) -> None:
        self.table = AgentTable(silent_after_s=silent_after_s,
                                silent_heartbeats=silent_heartbeats, log_limit=log_limit)
        self._events = events
        self.on_logs = on_logs
        #: Log records taken from agents within their budget (handed to
        #: ``on_logs`` or discarded); those over it: :attr:`limited_log_records`.
        self.log_records = 0
        #: ``agent.logs`` batches refused with ``BAD_BATCH``.
        self.bad_log_batches = 0
        #: Whether a key has a connection to the worker now (the daemon sets the
        #: swarm's); None: only the reports' times tell an agent is alive.
        self.connected: Callable[[bytes], bool] | None = None
        self._changed = trio.Event()
        #: Answers ``agent.shell_keys`` (the worker sets it); None: ``NO_SHELL``.
        self.shell_keys: ShellKeysSource | None = None
        router = Router()
        router.add(HELLO, self._hello)
        router.add(READY, self._ready)
        router.add(FAILED, self._failed)
        router.add(UNREADY, self._unready)
        router.add(HEARTBEAT, self._heartbeat)
        router.add(LOGS, self._logs)
        router.add(SHELL_KEYS, self._shell_keys)
        #: Serve this on the worker's swarm.
        self.service = RpcService(PROTOCOL, router)

    def expect(self, vmi: VmiSpec) -> None:
        """Expect ``vmi``'s agent (see :meth:`AgentTable.expect`)."""
        self.table.expect(vmi)

    def forget(self, name: str) -> None:
        """Stop expecting VMI ``name`` (after its delete)."""
        self.table.forget(name)
        self._wake()

    def state(self, name: str) -> AgentState | None:
        """What is known of VMI ``name``'s agent now, or None if not expected."""
        return self.table.state(name)

    @property
    def limited_log_records(self) -> dict[str, int]:
        """Agents' log records dropped by their budget, per job id (a copy)."""
        limiter = self.table.log_limiter
        return {} if limiter is None else limiter.dropped_by_job

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Report agents that fall silent; until cancelled.

        Sleeps until the table's next deadline or a change, whichever is
        first, so each pass is bounded and an idle worker does not poll.
        """
        task_status.started()
        while True:
            for event in self.table.expire(trio.current_time()):
                log.warning("agent.silent vmi=%s %s", event.vmi_name, event.message)
                await self._events.send(event)
            deadline = self.table.next_deadline()
            changed = self._changed
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _emit(self, events: list[AgentEvent]) -> None:
        if events:
            self._wake()  # a new or moved deadline
        for event in events:
            await self._events.send(event)

    @staticmethod
    def _caller(ctx: CallContext) -> bytes:
        if ctx.remote_public_key is None:  # only over a bare test channel
            raise RpcError(ReportCode.FORBIDDEN, "the caller's key is unknown")
        return ctx.remote_public_key

    async def _hello(self, params: Hello, ctx: CallContext) -> HelloResult:
        key = self._caller(ctx)
        try:
            outcome = self.table.hello(key, params, trio.current_time(),
                                       connected=self.connected)
        except AgentRefused as exc:
            if exc.code is ReportCode.ALREADY_BOUND:
                assert exc.bound_key is not None
                log.warning("agent.takeover_refused vmi=%s key=%s bound_key=%s reason=%s",
                            vmi_name(params.job_id, params.replica, params.node_rank),
                            format_key(key), format_key(exc.bound_key), exc.message)
            else:
                log.warning("agent.refused method=hello key=%s code=%s reason=%s",
                            format_key(key)[:12], exc.code, exc.message)
            raise RpcError(exc.code, exc.message) from None
        if outcome.replaced is not None:
            log.warning("agent.rebound vmi=%s key=%s replaced_key=%s generation=%d",
                        outcome.name, format_key(key), format_key(outcome.replaced),
                        params.generation)
        else:
            log.info("agent.hello vmi=%s key=%s generation=%d", outcome.name,
                     format_key(key)[:12], params.generation)
        await self._emit(outcome.events)
        return HelloResult(vmi=outcome.name)

    async def _report(self, ctx: CallContext, method: str, call) -> Ack:
        key = self._caller(ctx)
        try:
            events = call(key, trio.current_time())
        except AgentRefused as exc:
            log.info("agent.refused method=%s key=%s code=%s", method, format_key(key)[:12],
                     exc.code)
            raise RpcError(exc.code, exc.message) from None
        for event in events:
            log.info("agent.%s vmi=%s message=%r", event.kind, event.vmi_name, event.message)
        await self._emit(events)
        return Ack()

    async def _ready(self, params: Report, ctx: CallContext) -> Ack:
        return await self._report(ctx, "ready", lambda key, now: self.table.ready(
            key, params.message, now))

    async def _unready(self, params: Report, ctx: CallContext) -> Ack:
        return await self._report(ctx, "unready", lambda key, now: self.table.unready(
            key, params.message, now))

    async def _failed(self, params: Report, ctx: CallContext) -> Ack:
        return await self._report(ctx, "failed", lambda key, now: self.table.failed(
            key, params.message, now))

    async def _heartbeat(self, params: Heartbeat, ctx: CallContext) -> Ack:
        # No wake-up: a heartbeat only moves a deadline later, and run() finds
        # nothing to expire at the old one and sleeps again.
        metrics = params.metrics or None
        return await self._report(ctx, "heartbeat", lambda key, now: self.table.heartbeat(
            key, now, metrics))

    async def _logs(self, params: PushBatch, ctx: CallContext) -> PushResult:
        key = self._caller(ctx)
        try:
            taken = self.table.take_logs(key, params.records, trio.current_time())
        except AgentRefused as exc:
            if exc.code is ReportCode.BAD_BATCH:
                self.bad_log_batches += 1
            log.info("agent.refused method=logs key=%s code=%s reason=%s",
                     format_key(key)[:12], exc.code, exc.message)
            raise RpcError(exc.code, exc.message) from None
        if taken.warning is not None:
            # The worker's own record, under the job: the job's owner learns that
            # lines are missing and why. It is offered to the shipper directly
            # (its logging handler), never through an agent's budget.
            log.warning("agent logs cut on %s: %s | system job=%s replica=%d",
                        taken.vmi_name, taken.warning, taken.job_id, taken.replica,
                        extra={"job_id": taken.job_id, "replica": taken.replica})
        stamped = taken.records
        self.log_records += len(stamped)
        if self.on_logs is not None and stamped:
            self.on_logs(stamped)
        # Fewer than sent when the budget cut the batch: the first ``accepted``
        # were kept. Not an error, so the agent neither re-sends nor stops.
        return PushResult(accepted=len(stamped))

    async def _shell_keys(self, params: ShellKeysWait, ctx: CallContext) -> ShellKeys:
        key = self._caller(ctx)
        name = self.table.bound(key)
        if name is None:
            raise RpcError(ReportCode.NOT_INTRODUCED,
                           "say hello first: this key is bound to no VMI")
        found = None
        if self.shell_keys is not None:
            found = await self.shell_keys(name, params.version, params.wait_s)
        if found is None:
            raise RpcError(ReportCode.NO_SHELL, f"{name} is no container job's VMI here")
        return found
