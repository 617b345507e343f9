"""The agent's log records, shipped to its worker.

Agents never dial wrk-monitor: they run in VMs, with per-VM keys the monitor
does not know. When the agent's config says ``telemetry``, its log records go
to the worker it already reports to, over the same ``cosmicac-agent/1``
channel, with ``agent.logs`` (:mod:`contracts.agent_report`); the worker
re-stamps them with the replica its key proved and forwards them to
wrk-monitor with its own shipper.

Two kinds of records leave an agent:

- System: the agent's own ``logging`` records (the report loop, the swarm,
  the supervisor's ``cosmicac.agent.system`` steps), at INFO and above;
- Application: each line the model server (every step of the runtime's plan)
  writes to stdout or stderr. The supervisor logs them on
  ``cosmicac.agent.application`` with ``extra={"source": "Application",
  "stream": ...}`` (``agents/inference/_supervisor.py``); the handler here
  makes them Application records, INFO for stdout and WARNING for stderr, the
  text as written (no formatter), cut by :func:`~contracts.monitor.make_record`.

The queue is a :class:`~runtime.log_shipper.LogShipper`: ``offer`` never
blocks the logging thread, and beyond :data:`AGENT_MAX_RECORDS` the oldest
records are dropped and counted (``shipper.dropped``). The agent ships while
a session with the worker is up (after its hello, which binds its key) and
keeps records meanwhile, so shipping resumes on the next session.

Falls short: the counters are not on the agent's metrics endpoint yet; a
worker whose telemetry is off discards what it is sent (the worker renders
``telemetry`` from its own, so agents of such a worker never ship).
"""

from __future__ import annotations

import logging

from contracts.agent_config import AgentConfig
from contracts.agent_report import LOGS, agent_service
from contracts.model import JobType
from contracts.monitor import APPLICATION, SYSTEM, make_record
from runtime.log_shipper import LogShipper, ShipperHandler

__all__ = ["AGENT_MAX_RECORDS", "AgentLogHandler", "agent_shipper", "install_log_shipping"]

#: Records an agent holds while its worker is away. Application lines are at
#: most 8 KiB (the supervisor's cut), so at most ~80 MB and typically a few MB;
#: a daemon's shipper holds 100,000, but a VM's memory belongs to the job.
AGENT_MAX_RECORDS = 10_000
#: The loggers whose records never ship: the shipper's own (a failing push must
#: not feed the queue it failed to send).
_SKIPPED = ("runtime.log_shipper",)


def agent_shipper(*, max_records: int = AGENT_MAX_RECORDS, **kwargs) -> LogShipper:
    """A :class:`LogShipper` that pushes with ``agent.logs`` (over the agent's
    client to its worker, see :class:`agents._agent.Agent`'s ``shipper``)."""
    return LogShipper(max_records=max_records, method=LOGS, **kwargs)


class AgentLogHandler(ShipperHandler):
    """An agent's ``logging`` records as :class:`~contracts.monitor.LogRecord` s.

    Every record carries the agent's job id and replica (the worker re-stamps
    them anyway) and ``service`` :func:`~contracts.agent_report.agent_service`.
    A record logged with ``extra={"source": "Application"}`` is an Application
    record with its message as written, WARNING or above when its ``stream`` is
    ``stderr``; every other record is System, formatted by this handler.
    """

    def __init__(self, shipper: LogShipper, config: AgentConfig, *,
                 level: int = logging.INFO) -> None:
        super().__init__(shipper, service=agent_service(config.job_type), level=level)
        self.job_id = config.job_id
        self.replica = config.replica

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(_SKIPPED):
            return
        try:
            level = record.levelno
            if getattr(record, "source", None) == APPLICATION:
                source, text = APPLICATION, record.getMessage()
                if getattr(record, "stream", None) == "stderr":
                    level = max(level, logging.WARNING)
            else:
                source, text = SYSTEM, self.format(record)
            self.shipper.offer(make_record(
                text, service=self.service, source=source, level=level, job_id=self.job_id,
                replica=self.replica, time_ns=int(record.created * 1e9)))
        except Exception:
            self.handleError(record)


def install_log_shipping(config: AgentConfig, *, logger: logging.Logger | None = None,
                         shipper: LogShipper | None = None
                         ) -> tuple[LogShipper, AgentLogHandler] | None:
    """When ``config.telemetry`` is on, ship ``logger``'s records (the root's by default).

    Also lets the model server's lines through at INFO whatever the agent's own
    log level is: they are the job's Application log, not the agent's chatter.

    Returns:
        The shipper (give it to :class:`~agents._agent.Agent`) and the handler
        (remove it from ``logger`` when done), or None when telemetry is off.
    """
    if not config.telemetry:
        return None
    shipper = shipper or agent_shipper()
    handler = AgentLogHandler(shipper, config)
    (logger or logging.getLogger()).addHandler(handler)
    if config.job_type is JobType.INFERENCE:
        from .inference._supervisor import APPLICATION_LOG

        application = logging.getLogger(APPLICATION_LOG)
        if application.getEffectiveLevel() > logging.INFO:
            application.setLevel(logging.INFO)
    return shipper, handler
