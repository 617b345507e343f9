"""The agent's service: join the swarm, find the worker, say who we are, report.

One agent runs per VMI (or, on the ``local`` backend, per simulated VMI
process). Its life, as a tree of tasks::

    Agent.run
    ├── Swarm.run             our one swarm: DHT (config.bootstrap), relay
    │                         reservations (config.relays), one connection per peer
    ├── workload              what the job runs (the model server of an inference
    │                         job): says ready and unready as it comes and goes;
    │                         None: ready once the swarm is up and hello succeeded
    └── report loop           session after session, with backoff between them:
            connect to the worker by key (config.worker_addresses first, then DHT)
            agent.hello  ─ agent.ready (or agent.failed) ─ agent.heartbeat every
            heartbeat_interval_s, until the connection or a call fails
            ├── log shipping    with a shipper (telemetry on): after hello,
                                agent.logs batches on the same channel (_logs.py)
            └── shell keys      a container job's agent: agent.shell_keys, a long
                                poll for its team's newer shell keys

Shell keys (a GPU Container Job): who may open shells follows the team's
membership while the job runs (:mod:`contracts.shell_access`). The agent starts
with its config's ``authorized_keys`` at ``shell_keys_version``, or the newer
set it saved in its storage, and asks its worker on every session (at once,
then a long poll) for a newer set; each one taken is saved, and the shell
sessions of keys that lost access are closed. A worker that does not know the
method (older) leaves the agent with the keys it has.

With telemetry on, each heartbeat also carries the agent's figures
(:mod:`._metrics`: its process, its sessions, and the workload's own through
an optional ``Workload.metrics()``), built when the beat is sent. With it
off the heartbeat stays empty: an older worker refuses the field, and only a
worker that knows it turns telemetry on.

Each session starts with ``hello`` (a worker that restarted has forgotten us)
and then repeats ``ready`` if the workload is ready, and later ``unready`` and
``ready`` again as the workload's health changes. A session that fails for
any reason the network or the worker may cure (unreachable, timed out, channel
closed, ``UNKNOWN_REPLICA`` while the restarted worker re-learns its VMIs)
is retried after a jittered, doubling wait capped at ``backoff_max_s``; the
agent never gives up on the worker by itself, because a VMI outlives worker
outages and its replica should come back when the worker does. A refusal
that can never succeed (``FORBIDDEN``, ``STALE_GENERATION``) ends the agent
with :class:`AgentRefused`. A workload (or readiness hook) that raises is
reported with ``agent.failed`` and ends the agent with :class:`AgentGaveUp`.

Log shipping never holds a session up: the shipper's queue is bounded (the
oldest records go, counted) and filled without blocking, a push that fails
leaves its records queued for the next try or session, and a refused batch
(``BAD_BATCH``) is dropped. A session ends only for the reports' reasons.
"""

from __future__ import annotations

import ipaddress
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from contracts.agent_config import AgentConfig
from contracts.agent_report import (
    FAILED,
    FATAL_CODES,
    HEARTBEAT,
    HELLO,
    PROTOCOL,
    READY,
    UNREADY,
    Heartbeat,
    Hello,
    Report,
)
from contracts.model import JobType
from contracts.shell_access import SHELL_KEYS, ShellKeys, ShellKeysWait
from p2p.errors import P2PError
from p2p.host import Reserved, Service
from p2p.keys import KeyPair, format_key
from p2p.net import Network
from p2p.rpc import Method, RpcClient, RpcError
from p2p.swarm import Connection, Swarm, SwarmConfig, SwarmError
from runtime.log_shipper import LogShipper

from ._metrics import clean, process_metrics

if TYPE_CHECKING:
    from .instance import ShellAccess

__all__ = ["Agent", "AgentGaveUp", "AgentRefused", "ReportPolicy", "Workload", "WorkloadStatus",
           "listen_host", "reserved_peers"]

log = logging.getLogger("cosmicac.agent")

#: ``async def readiness() -> None``: returns once the workload serves; raises
#: (any ``Exception``) when it cannot: its text becomes ``agent.failed``'s message.
Readiness = Callable[[], Awaitable[None]]
Address = tuple[str, int]


class WorkloadStatus(Protocol):
    """What a workload tells its agent (who tells the worker)."""

    def ready(self, message: str) -> None:
        """The workload serves (again)."""

    def unready(self, message: str) -> None:
        """The workload stopped serving for a while (it is being restarted)."""


class Workload(Protocol):
    """What a job's agent runs beside its reports: the services it adds to the
    agent's swarm and a task that says ready/unready and raises when it cannot go on."""

    @property
    def services(self) -> Sequence[Service]: ...

    async def run(self, status: WorkloadStatus, swarm: Swarm) -> None:
        """Run until cancelled; raise (any ``Exception``) when the workload cannot run."""


class AgentRefused(Exception):
    """The worker refused our hello for good (``FORBIDDEN``, ``STALE_GENERATION``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"the worker refused this agent ({code}): {message}")
        self.code = code


class AgentGaveUp(Exception):
    """The readiness hook failed: the workload cannot run here."""


@dataclass(frozen=True)
class ReportPolicy:
    """Timing of the report loop (what tests shorten)."""

    #: First wait after a failed session; doubles up to ``backoff_max_s``.
    #: Jittered down to half, so a worker's agents do not return in a herd.
    backoff_min_s: float = 0.5
    #: Longest wait between two sessions (hyperswarm's retry timer caps at 30 s too).
    backoff_max_s: float = 30.0
    #: Connect plus hello, per session.
    connect_timeout_s: float = 20.0
    #: Each call's timeout; None: the heartbeat interval, at least 5 s.
    call_timeout_s: float | None = None
    #: After a failed readiness, how long we try to tell the worker before exiting.
    failure_report_s: float = 30.0
    #: How long the worker may hold an ``agent.shell_keys`` long poll.
    shell_keys_wait_s: float = 20.0
    #: After a refused ``agent.shell_keys`` (not UNKNOWN_METHOD): wait, ask again.
    shell_keys_retry_s: float = 5.0


def listen_host(addresses: Sequence[Address]) -> str:
    """Where the agent listens: loopback when every peer it knows is on loopback
    (the ``local`` backend, tests), else every address of their family."""
    if not addresses:
        return "0.0.0.0"
    ips = []
    for host, _port in addresses:
        try:
            ips.append(ipaddress.ip_address(host))
        except ValueError:
            return "0.0.0.0"
    if all(ip.is_loopback for ip in ips):
        return "::1" if ips[0].version == 6 else "127.0.0.1"
    return "::" if ips[0].version == 6 else "0.0.0.0"


def reserved_peers(config: AgentConfig, access: ShellAccess | None) -> Reserved:
    """The keys that keep connection slots under a flood of strangers: the
    worker, the relays, and who may use the workload: for a container job the
    shell keys ``access`` holds now (a member added while the job runs too,
    no longer one removed), else the config's ``authorized_keys`` (an
    inference job's proxies)."""
    users = config.authorized_keys if access is None else ()
    fixed = frozenset(bytes.fromhex(key) for key in (config.worker, *config.relays, *users))
    if access is None:
        return fixed.__contains__
    return lambda key: key in fixed or key in access


def _single(group: BaseExceptionGroup) -> BaseException:
    """The one real failure of a nursery (the others are the cancellations it caused)."""
    leaves: list[BaseException] = []
    todo: list[BaseException] = [group]
    while todo:
        exc = todo.pop()
        if isinstance(exc, BaseExceptionGroup):
            todo.extend(exc.exceptions)
        elif not isinstance(exc, trio.Cancelled):
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else group


class Agent:
    """One agent: its swarm and its reports to the worker.

    Args:
        config: the agent's config (from the worker).
        keypair: the agent's identity (kept in its storage folder).
        bootstrap: ``config.bootstrap`` (typed by the config); worker_addresses: likewise.
        readiness: the workload's readiness hook; None: ready at once.
        network: sockets (tests may give an in-memory network).
        policy: backoff and timeouts.
        rng: jitter (seeded in tests).
        shipper: the agent's log records (:func:`agents._logs.install_log_shipping`),
            shipped to the worker during each session; None: no shipping.
        state_dir: where the newest shell keys are kept across restarts (the
            agent's storage); None: not kept.
        keep_descendants: (a container job's agent process) adopt every process
            a shell starts, so a key that loses access loses its background
            processes too; this makes the whole process a child subreaper, so
            only the agent's own process sets it.

    Run it with ``await nursery.start(agent.run)``; it reports the swarm's address.
    """

    def __init__(self, config: AgentConfig, keypair: KeyPair, *,
                 bootstrap: Sequence[Address] = (), worker_addresses: Sequence[Address] = (),
                 readiness: Readiness | None = None, workload: Workload | None = None,
                 network: Network | None = None,
                 policy: ReportPolicy | None = None, rng: random.Random | None = None,
                 host: str | None = None, shipper: LogShipper | None = None,
                 state_dir: Path | None = None, keep_descendants: bool = False) -> None:
        self.config = config
        self.state_dir = state_dir
        #: Who may open shells (a container job's agent); see the module doc.
        self.access = self._initial_access(config, state_dir)
        self.keypair = keypair
        self.worker = bytes.fromhex(config.worker)
        self.worker_addresses = tuple(worker_addresses)
        self.policy = policy or ReportPolicy()
        self.rng = rng or random.Random()
        self.readiness = readiness
        self.workload = workload
        self.shipper = shipper
        swarm_config = SwarmConfig(
            host=host or listen_host([*bootstrap, *worker_addresses]), port=0,
            bootstrap=tuple(bootstrap),
            relays=tuple(bytes.fromhex(key) for key in config.relays),
            known_peers=tuple((bytes.fromhex(key), tuple(where))
                              for key, where in config.relay_addresses.items()))
        services = list(self._services(config, self.access, keep_descendants))
        #: The container job's shell service (its sessions are figures), or None.
        self.shells = next((s for s in services if hasattr(s, "sessions_total")), None)
        if workload is not None:
            services.extend(workload.services)
        self.swarm = Swarm(keypair, config=swarm_config, network=network, services=services)
        self.swarm.add_reserved(reserved_peers(config, self.access))
        #: Where the swarm listens, once it runs.
        self.swarm_address: Address | None = None
        #: The VMI the worker bound us to, once a hello succeeded.
        self.vmi: str | None = None
        #: Set once the workload first said ready, or failed.
        self.settled = trio.Event()
        self.failure: str | None = None
        #: Whether the workload serves now, and why not when it does not.
        self.workload_ready = False
        self.workload_message = ""
        self._changed = trio.Event()
        #: Sessions that reached hello, and failed sessions (for tests and logs).
        self.sessions = 0
        self.failed_sessions = 0
        self._reached_hello = False
        self._call_timeout_s = (self.policy.call_timeout_s if self.policy.call_timeout_s
                                else max(5.0, config.heartbeat_interval_s))

    def metrics(self) -> dict[str, float]:
        """The figures a heartbeat carries now (see :mod:`._metrics`): cheap
        reads of counters kept anyway; a workload's ``metrics()`` that raises
        costs its own figures only."""
        values: dict[str, float] = process_metrics()
        values["report_sessions_total"] = float(self.sessions)
        if self.shells is not None:
            values["shell_sessions_open"] = float(self.shells.sessions)
            values["shell_sessions_total"] = float(self.shells.sessions_total)
            values["shell_sessions_revoked_total"] = float(self.shells.sessions_revoked)
            if self.shells.descendants is not None:
                descendants = self.shells.descendants
                values["shell_background_killed_total"] = float(descendants.killed_total)
                values["shell_orphans_unattributed_total"] = float(
                    descendants.unattributed_total)
        source = getattr(self.workload, "metrics", None)
        if callable(source):
            try:
                values.update(source())
            except Exception as exc:  # a figure is never worth a heartbeat
                log.debug("agent.metrics_failed %s reason=%s", self.label, exc)
        return clean(values)

    @staticmethod
    def _initial_access(config: AgentConfig, state_dir: Path | None):
        """The shell keys to start with: the config's, or the newer saved set."""
        if config.job_type is not JobType.CONTAINER:
            return None
        from .instance import ShellAccess, load_saved

        access = ShellAccess(config.authorized_keys, config.shell_keys_version)
        saved = load_saved(state_dir) if state_dir is not None else None
        if saved is not None and saved[1] > access.version:
            access = ShellAccess(*saved)
        return access

    @staticmethod
    def _services(config: AgentConfig, access, keep_descendants: bool) -> list:
        """What the agent serves on its swarm: a GPU Container Job's shells.

        The shell service's firewall admits the job's authorised user keys (as
        they are now: :attr:`access`), and the worker and relays this agent
        itself dials (a firewall is asked on outgoing dials too); nobody else
        gets a connection at all.
        """
        if config.job_type is not JobType.CONTAINER:
            return []
        from .instance import Descendants, ShellService, become_subreaper

        descendants = None
        if keep_descendants:
            if become_subreaper():
                descendants = Descendants()
            else:
                log.warning("agent.no_subreaper job=%s: a shell's background processes "
                            "outlive its key's access", config.job_id)
        peers = frozenset([bytes.fromhex(config.worker),
                           *(bytes.fromhex(key) for key in config.relays)])
        return [ShellService(access.__contains__, peers=peers.__contains__,
                             job_id=config.job_id, descendants=descendants)]

    async def apply_shell_keys(self, update: ShellKeys) -> bool:
        """Take a newer set of shell keys: save it, close the sessions of keys
        that lost access. Returns False (nothing done) for a set not newer."""
        if self.access is None:
            return False
        old_version = self.access.version
        try:
            removed = self.access.update(update.keys, update.version)
        except ValueError as exc:  # the contract checked them; a bug if it happens
            log.error("agent.shell_keys_refused %s reason=%s", self.label, exc)
            return False
        if removed is None:
            return False
        log.info("agent.shell_keys %s version=%d previous=%d keys=%d removed=%d", self.label,
                 update.version, old_version, len(self.access.keys), len(removed))
        if removed and self.shells is not None:
            self.shells.close_unauthorized(
                "your access to this job was removed (you are no longer a member of its "
                "team, or your CLI key changed): the session is closed")
        if self.state_dir is not None:
            try:
                await trio.to_thread.run_sync(self.access.save, self.state_dir)
            except OSError as exc:
                log.warning("agent.shell_keys_not_saved %s reason=%s", self.label, exc)
        return True

    @property
    def label(self) -> str:
        c = self.config
        return f"job={c.job_id} replica={c.replica} node_rank={c.node_rank} gen={c.generation}"

    async def run(self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Join the swarm, then report until cancelled.

        Raises:
            AgentRefused: the worker will never accept this agent.
            AgentGaveUp: the readiness hook failed (reported to the worker if we could).
            OSError: the swarm cannot listen.
        """
        try:
            async with trio.open_nursery() as nursery:
                address = await nursery.start(self.swarm.run)
                self.swarm_address = address
                log.info("agent.started %s key=%s address=%s:%d worker=%s relays=%d",
                         self.label, self.keypair.hex, *address, self.config.worker[:12],
                         len(self.config.relays))
                nursery.start_soon(self._run_readiness)
                if self.shells is not None:
                    nursery.start_soon(self.shells.watch_descendants)
                task_status.started(address)
                await self._report_forever()
        except BaseExceptionGroup as group:
            raise _single(group) from None

    async def _run_readiness(self) -> None:
        try:
            if self.workload is not None:
                await self.workload.run(self, self.swarm)
                raise RuntimeError("the workload ended")
            if self.readiness is not None:
                await self.readiness()
            self.ready("agent ready")
        except Exception as exc:
            if isinstance(exc, BaseExceptionGroup):
                exc = _single(exc)  # the workload's own nursery wrapped the reason
            self.failure = str(exc) or type(exc).__name__
            log.error("agent.workload_failed %s reason=%s", self.label, self.failure)
            self._change()
        finally:
            self.settled.set()

    # -- WorkloadStatus ------------------------------------------------------------------

    def ready(self, message: str) -> None:
        self.workload_ready, self.workload_message = True, message
        self.settled.set()
        self._change()

    def unready(self, message: str) -> None:
        self.workload_ready, self.workload_message = False, message
        self._change()

    def _change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- sessions ------------------------------------------------------------------------

    async def _report_forever(self) -> None:
        failures = 0
        give_up_at: float | None = None
        while True:
            if self.failure is not None and give_up_at is None:
                give_up_at = trio.current_time() + self.policy.failure_report_s
            try:
                with trio.move_on_at(give_up_at if give_up_at is not None else float("inf")):
                    await self._session()
                if give_up_at is not None and trio.current_time() >= give_up_at:
                    raise AgentGaveUp(f"{self.failure} (the worker could not be told)")
            except RpcError as exc:
                if exc.code in FATAL_CODES:
                    log.error("agent.refused %s code=%s reason=%s", self.label, exc.code,
                              exc.message)
                    raise AgentRefused(exc.code, exc.message) from None
                reason = f"{exc.code}: {exc.message}"
            except (P2PError, OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    trio.TooSlowError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if self.vmi is not None and self._reached_hello:
                failures = 0  # the worker was there: start the backoff afresh
            failures += 1
            self.failed_sessions += 1
            cap = min(self.policy.backoff_max_s, self.policy.backoff_min_s * 2 ** (failures - 1))
            wait = cap * (0.5 + 0.5 * self.rng.random())
            log.warning("agent.worker_lost %s reason=%s retry_in_s=%.2f", self.label, reason,
                        wait)
            await trio.sleep(wait)

    async def _connect(self) -> Connection:
        """The connection to the worker: its known addresses first, then the DHT, then
        through the relays (the worker holds a reservation on them): a cluster
        network that cannot reach the worker reaches it through a relay box."""
        relays = self.swarm.config.relays
        failures: list[str] = []
        if self.worker_addresses:
            try:
                return await self.swarm.connect(self.worker, addresses=self.worker_addresses)
            except P2PError as exc:
                if not self.swarm.config.bootstrap and not relays:
                    raise
                failures.append(f"direct: {exc}")
                log.info("agent.direct_failed %s reason=%s", self.label, exc)
        if self.swarm.config.bootstrap:
            try:
                return await self.swarm.connect(self.worker)
            except P2PError as exc:
                if not relays:
                    raise
                failures.append(f"dht: {exc}")
                log.info("agent.dht_failed %s reason=%s trying=relays", self.label, exc)
        try:
            return await self.swarm.connect(self.worker, relays=relays)
        except SwarmError as exc:
            raise SwarmError("; ".join([*failures, f"relays: {exc}"]), code=exc.code) from None

    async def _session(self) -> None:
        """One connection's worth of reports; returns only by raising."""
        self._reached_hello = False
        connection: Connection | None = None
        try:
            with trio.fail_after(self.policy.connect_timeout_s):
                connection = await self._connect()
                channel = await connection.open_channel(PROTOCOL)
            client = RpcClient(channel, name=f"agent-report-{self.config.worker[:12]}")
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(client.run)
                    try:
                        await self._reports(client, nursery)
                    finally:
                        nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                raise _single(group) from None
        except BaseException:
            if connection is not None:
                # Maybe stuck: close it, so the next session dials afresh.
                with trio.CancelScope(shield=True):
                    await connection.aclose()
            raise

    async def _call(self, client: RpcClient, method: Method, params):
        return await client.call(method, params, timeout_s=self._call_timeout_s)

    async def _ship_logs(self, client: RpcClient) -> None:
        """Ship the log records over this session's client until it ends."""
        shipper = self.shipper
        assert shipper is not None
        while True:
            await shipper.ship(client)  # returned: a push failed, its records kept
            await trio.sleep(shipper.retry_s)

    async def _follow_shell_keys(self, client: RpcClient) -> None:
        """Ask the worker for newer shell keys, at once and then in a long poll,
        for as long as the session lasts (a broken call ends the session)."""
        assert self.access is not None
        wait_s = self.policy.shell_keys_wait_s
        while True:
            try:
                update = await client.call(
                    SHELL_KEYS, ShellKeysWait(version=self.access.version, wait_s=wait_s),
                    timeout_s=wait_s + self._call_timeout_s)
            except RpcError as exc:
                if exc.code == "UNKNOWN_METHOD":
                    log.info("agent.shell_keys_unsupported %s worker=%s: keeping the "
                             "config's keys", self.label, self.config.worker[:12])
                    return
                log.warning("agent.shell_keys_failed %s code=%s reason=%s", self.label,
                            exc.code, exc.message)
                await trio.sleep(self.policy.shell_keys_retry_s)
                continue
            applied = await self.apply_shell_keys(update)
            if not applied and update.version < self.access.version:
                log.debug("agent.shell_keys_stale %s version=%d held=%d", self.label,
                          update.version, self.access.version)
                # Not newer and not the same: the worker is behind us (its
                # state was restored); do not spin on its instant answers.
                await trio.sleep(wait_s)

    async def _reports(self, client: RpcClient, nursery: trio.Nursery) -> None:
        c = self.config
        result = await self._call(client, HELLO, Hello(
            job_id=c.job_id, replica=c.replica, generation=c.generation,
            node_rank=c.node_rank, token=c.report_token))
        self.vmi = result.vmi
        self._reached_hello = True
        self.sessions += 1
        log.info("agent.hello %s vmi=%s worker=%s session=%d", self.label, self.vmi,
                 format_key(self.worker)[:12], self.sessions)
        if self.shipper is not None:
            nursery.start_soon(self._ship_logs, client)
        if self.access is not None:
            nursery.start_soon(self._follow_shell_keys, client)
        reported_ready = False
        interval = c.heartbeat_interval_s
        next_beat = trio.current_time() + interval
        while True:
            changed = self._changed
            if self.failure is not None:
                await self._call(client, FAILED, Report(message=self.failure[:1000]))
                log.error("agent.failed_reported %s vmi=%s", self.label, self.vmi)
                raise AgentGaveUp(self.failure)
            if self.workload_ready != reported_ready:
                message = Report(message=self.workload_message[:1000])
                await self._call(client, READY if self.workload_ready else UNREADY, message)
                reported_ready = self.workload_ready
                log.info("agent.%s %s vmi=%s message=%s",
                         "ready" if reported_ready else "unready", self.label, self.vmi,
                         self.workload_message)
            with trio.move_on_at(next_beat):
                await changed.wait()
            if trio.current_time() >= next_beat:
                beat = (Heartbeat(metrics=self.metrics()) if c.telemetry else Heartbeat())
                await self._call(client, HEARTBEAT, beat)
                log.debug("agent.heartbeat %s vmi=%s", self.label, self.vmi)
                next_beat = max(next_beat + interval, trio.current_time())
