"""How an agent reports to the worker that started it: RPC protocol ``cosmicac-agent/1``.

The worker serves it on its swarm; every agent opens one channel to it per
connection and calls, in order::

    agent.hello(job_id, replica, generation, node_rank, token)  -> {vmi}
    agent.ready(message)            once the replica serves (again after each hello)
    agent.unready(message)          it stopped serving for a while (its model
                                    server restarts); ready follows when it is back
    agent.heartbeat()               every heartbeat_interval_s
    agent.failed(message)           the agent gave up (its workload cannot start)
    agent.logs(records)             the agent's log records (only when its config's
                                    ``telemetry`` is on), at any time after hello
    agent.shell_keys(version, wait_s)  a container agent's long poll for its team's
                                    shell keys (contracts/shell_access.py), after hello

``hello`` proves which VMI the caller is: the token is the VMI's
``AgentConfig.report_token`` (only the worker and that VMI's cloud-init know
it; the worker keeps only its SHA-256). On success the worker binds the
caller's public key, as proven by the Noise handshake of its connection, to
that VMI, unless another key is bound to it whose agent is still alive
(``ALREADY_BOUND``: a token read somewhere does not take a live VMI over);
every later call is
authorised by that key alone, never by anything in the message
(seeds/architecture.txt: authorise by the caller's key). A new connection
(after the worker or the network went away) starts with ``hello`` again.

Each message is a msgpack map (p2p/rpc README, "Wire format"):

=================  =====================================================  ==========
method             params                                                 result
=================  =====================================================  ==========
``agent.hello``    ``job_id: str, replica: int, generation: int,``        ``vmi: str``
                   ``node_rank: int, token: str (64 hex)``
``agent.ready``    ``message: str (≤ 1,000)``                             ``{}``
``agent.failed``   ``message: str (≤ 1,000)``                             ``{}``
``agent.unready``  ``message: str (≤ 1,000)``                             ``{}``
``agent.heartbeat`` ``metrics: {str: float}`` (optional, ≤ 32)               ``{}``
``agent.logs``     ``records: bytes`` (:class:`~contracts.monitor.PushBatch`)  ``accepted: int``
=================  =====================================================  ==========

``agent.logs`` carries a record batch in wrk-monitor's wire format
(:mod:`contracts.monitor`, "Wire format of a record batch"). Agents never
dial wrk-monitor (they run in VMs with keys it does not know): their worker
checks the batch, re-stamps every record's ``job_id`` and ``replica`` with
those of the VMI the caller's key is bound to (so an agent can never write
another job's logs) and its ``service`` with :func:`agent_service` of the
VMI's job type, keeps ``time_ns``, ``source`` (System or Application),
``level`` and ``text``, and forwards the records with its own log shipper. A
batch that does not decode is refused whole with ``BAD_BATCH``; the worker
whose telemetry is off accepts and discards. The worker limits each agent's
records (a token bucket per VMI): over budget, it keeps a batch's first
``accepted`` records and drops the rest, and still answers (not an error: the
agent neither re-sends nor stops). ``agent.logs`` is not a report:
it neither feeds nor ends an agent's silence (heartbeats do).

``agent.heartbeat`` may carry the agent's own figures: at most
:data:`MAX_AGENT_METRICS` values named ``^[a-z][a-z0-9_]{0,47}$``, each finite
and non-negative (a name ending in ``_total`` is a counter, any other a gauge).
The worker keeps the latest per VMI, labelled with the VMI's job id, replica
and node rank (never with anything the agent claims), and forwards them to
wrk-monitor. The field was added after version 1 shipped and ``Heartbeat`` is
``extra="forbid"``: an older worker refuses a heartbeat that carries it, so an
agent sends metrics only when its config's ``telemetry`` is on (which only a
worker that knows this field sets); an older agent's empty heartbeat is still
valid.

Errors carry a stable code (:class:`ReportCode`); an agent branches on it:
``FORBIDDEN`` and ``STALE_GENERATION`` will never succeed (the agent stops),
``BAD_BATCH`` refuses one log batch (the agent drops it, it goes on),
``UNKNOWN_REPLICA`` and ``NOT_INTRODUCED`` may (the worker has not re-learnt
its VMIs yet after a restart, or the VMI was re-expected): hello again later.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field

from contracts.monitor import (
    MAX_AGENT_VALUES,
    AgentMetricName,
    AgentMetricValue,
    PushBatch,
    PushResult,
)
from p2p.rpc import Method

from ._compat import AddedLater
from .model import JobType

__all__ = [
    "FAILED",
    "FATAL_CODES",
    "HEARTBEAT",
    "HELLO",
    "LOGS",
    "MAX_AGENT_METRICS",
    "PROTOCOL",
    "READY",
    "UNREADY",
    "Ack",
    "Heartbeat",
    "Hello",
    "HelloResult",
    "MetricName",
    "MetricValue",
    "Report",
    "ReportCode",
    "agent_service",
]

#: The channel protocol the worker serves for its agents.
PROTOCOL = "cosmicac-agent/1"
#: A status line is for a human reading the job's System log, not a transcript.
MAX_MESSAGE_CHARS = 1_000
#: Figures in one heartbeat: a handful is what an agent has; the bound keeps
#: wrk-monitor's series per agent (and a hostile agent's) small.
MAX_AGENT_METRICS = MAX_AGENT_VALUES
#: A metric's name as an agent sends it (wrk-monitor exposes it as
#: ``cosmicac_agent_<name>``): a Prometheus-safe, short, lower-case name.
MetricName = AgentMetricName
#: A figure: finite, non-negative, at most 2**63 (counters and gauges alike).
MetricValue = AgentMetricValue


class ReportCode(enum.StrEnum):
    """The stable error codes of ``cosmicac-agent/1``."""

    #: The token does not match the VMI's: this caller is not that agent.
    FORBIDDEN = "FORBIDDEN"
    #: The worker expects no VMI with this job, replica and node rank (now).
    UNKNOWN_REPLICA = "UNKNOWN_REPLICA"
    #: The VMI was replaced by a restart: this agent belongs to the old one.
    STALE_GENERATION = "STALE_GENERATION"
    #: A report from a key no hello has bound (or whose binding was reset).
    NOT_INTRODUCED = "NOT_INTRODUCED"
    #: The token is right, but another key is bound to the VMI and its agent is
    #: alive (connected, or reported within its silence window): a second agent
    #: cannot take a live VMI over. Not fatal: an agent that replaced a dead one
    #: (its storage, and so its key, lost) retries, and binds once the old one
    #: is gone.
    ALREADY_BOUND = "ALREADY_BOUND"
    #: An ``agent.logs`` batch that is not valid records (refused whole; the
    #: same code as wrk-monitor's ``logs.push``, so a log shipper drops it).
    BAD_BATCH = "BAD_BATCH"
    #: ``agent.shell_keys`` from an agent whose VMI is no container job's.
    NO_SHELL = "NO_SHELL"


#: Codes after which hello can never succeed for this agent: it stops.
FATAL_CODES = frozenset({ReportCode.FORBIDDEN, ReportCode.STALE_GENERATION})


def agent_service(job_type: JobType) -> str:
    """The ``service`` of an agent's log records: ``agent-inference`` (a Managed
    Inference Job's agent) or ``agent-instance`` (a GPU Container Job's)."""
    return "agent-inference" if job_type is JobType.INFERENCE else "agent-instance"


class Hello(BaseModel):
    """Which VMI the caller claims to be, with the proof."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(min_length=1, max_length=64)
    replica: int = Field(ge=0, lt=1024)
    generation: int = Field(ge=0)
    node_rank: int = Field(ge=0, le=64)
    #: ``AgentConfig.report_token``; compared in constant time, never logged.
    token: str = Field(pattern=r"^[0-9a-f]{64}$", repr=False)


class HelloResult(BaseModel):
    """The VMI the caller's key is now bound to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vmi: str


class Report(BaseModel):
    """A readiness or failure report with its System log line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    message: str = Field(default="", max_length=MAX_MESSAGE_CHARS)


class Heartbeat(AddedLater):
    """"Still here" (the caller's key says who), with the agent's latest figures."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # An empty heartbeat stays ``{}`` on the wire, as version 1 sent it.
    _added_later = ("metrics",)

    #: The agent's figures now (see the module doc); empty from an older agent
    #: or with telemetry off.
    metrics: dict[MetricName, MetricValue] = Field(default_factory=dict,
                                                   max_length=MAX_AGENT_METRICS)



class Ack(BaseModel):
    """The worker took the report."""

    model_config = ConfigDict(extra="forbid", frozen=True)


HELLO = Method("agent.hello", params=Hello, result=HelloResult)
READY = Method("agent.ready", params=Report, result=Ack)
FAILED = Method("agent.failed", params=Report, result=Ack)
UNREADY = Method("agent.unready", params=Report, result=Ack)
HEARTBEAT = Method("agent.heartbeat", params=Heartbeat, result=Ack)
LOGS = Method("agent.logs", params=PushBatch, result=PushResult)
