"""An agent's log records reach its worker: its own logging as System records, its
model server's output as Application records; the queue is bounded while the
worker is away and shipping resumes with the next session (real 127.0.0.1
sockets and processes, bounded waits). An agent process ships its own: in
tests/agents/test_agent_process.py, whose agent runs with telemetry on."""

from __future__ import annotations

import logging

import trio

from agents._agent import Agent, ReportPolicy
from agents._logs import AGENT_MAX_RECORDS, AgentLogHandler, agent_shipper, install_log_shipping
from agents.inference import ModelSupervisor, SupervisorPolicy
from agents.inference._supervisor import APPLICATION_LOG
from agents.inference.runtimes import Lifetime, RuntimePlan, Step, StepRole
from contracts.agent_report import LOGS
from contracts.model import JobType, Runtime
from contracts.monitor import APPLICATION, CUT_MARKER, MAX_TEXT_CHARS, SYSTEM
from p2p.keys import KeyPair

from ..p2p.helpers import wait_until
from .helpers import Collected, agent_config, running_worker, vmi_of

QUICK = ReportPolicy(backoff_min_s=0.05, backoff_max_s=0.2, connect_timeout_s=5)


def isolated_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


async def test_an_agents_own_logging_reaches_the_worker_as_its_system_records(nursery):
    collected = Collected()
    logger = isolated_logger("tests.agent_logs.system")
    async with running_worker(nursery, on_logs=collected) as worker:
        config = agent_config(worker.keypair.public_key, address=worker.address, replica=2)
        worker.registry.expect(vmi_of(config))
        shipper = agent_shipper(flush_interval_s=0.01, retry_s=0.05)
        handler = AgentLogHandler(shipper, config)
        logger.addHandler(handler)
        try:
            logger.debug("below INFO: not shipped")
            logger.warning("disk %s is slow", "vda")  # before the worker is reached: kept
            agent = Agent(config, KeyPair.generate(), worker_addresses=[worker.address],
                          policy=QUICK, shipper=shipper)
            await nursery.start(agent.run)
            logger.info("after hello")
            await wait_until(lambda: len(collected.records) >= 2, limit_s=10)
            # The worker holds the records before the agent reads its acknowledgement.
            await wait_until(lambda: shipper.sent >= 2, limit_s=10)
        finally:
            logger.removeHandler(handler)
        assert collected.texts() == ["disk vda is slow", "after hello"]
        assert {(r.job_id, r.replica, r.source, r.service) for r in collected.records} == {
            (config.job_id, 2, SYSTEM, "agent-instance")}
        assert [r.level for r in collected.records] == [logging.WARNING, logging.INFO]
        assert shipper.sent == 2 and shipper.dropped == 0
        nursery.cancel_scope.cancel()


async def test_the_queue_is_bounded_while_the_worker_is_away_and_shipping_resumes(nursery):
    collected = Collected()
    logger = isolated_logger("tests.agent_logs.away")
    async with running_worker(nursery, on_logs=collected) as worker:
        config = agent_config(worker.keypair.public_key, address=worker.address)
        shipper = agent_shipper(max_records=50, flush_interval_s=0.01, retry_s=0.05)
        handler = AgentLogHandler(shipper, config)
        logger.addHandler(handler)
        try:
            # The worker does not expect this VMI yet: every session ends at hello.
            agent = Agent(config, KeyPair.generate(), worker_addresses=[worker.address],
                          policy=QUICK, shipper=shipper)
            await nursery.start(agent.run)
            for i in range(200):
                logger.info("away %d", i)
            await wait_until(lambda: agent.failed_sessions >= 2, limit_s=10)
            assert shipper.pending == 50 and shipper.dropped == 150 and shipper.sent == 0
            worker.registry.expect(vmi_of(config))
            await wait_until(lambda: len(collected.records) >= 50, limit_s=10)
            assert collected.texts() == [f"away {i}" for i in range(150, 200)]
            # The worker holds them before the agent reads the acknowledgement: a
            # session cut before that would send them again (as it should).
            await wait_until(lambda: shipper.sent >= 50, limit_s=10)
            # The worker forgets the VMI (as after its restart): logs and reports are
            # refused, the records wait, the next session's hello resumes shipping.
            worker.registry.forget(vmi_of(config).name)
            sessions, failed = agent.sessions, agent.failed_sessions
            for i in range(10):
                logger.info("between %d", i)
            # This session's next heartbeat is refused, then the next session's hello
            # (counted from now: more sessions may have failed while the worker was away).
            await wait_until(lambda: agent.failed_sessions >= failed + 2, limit_s=10)
            worker.registry.expect(vmi_of(config))
            await wait_until(lambda: len(collected.records) >= 60, limit_s=10)
            assert agent.sessions > sessions
        finally:
            logger.removeHandler(handler)
        assert collected.texts()[50:] == [f"between {i}" for i in range(10)]
        assert shipper.dropped == 150 and shipper.pending == 0
        nursery.cancel_scope.cancel()


def sh(name: str, script: str) -> Step:
    return Step(name=name, argv=("sh", "-c", script), role=StepRole.RAY_WORKER,
                lifetime=Lifetime.KEEP_RUNNING, timeout_s=None, stop_timeout_s=2.0)


async def test_the_model_servers_output_becomes_application_records():
    config = agent_config(b"\x01" * 32).model_copy(update={
        "job_type": JobType.INFERENCE, "runtime": Runtime.VLLM, "model": "m"})
    shipper = agent_shipper()
    handler = AgentLogHandler(shipper, config)
    application = logging.getLogger(APPLICATION_LOG)
    plan = RuntimePlan(runtime=Runtime.VLLM, listens=False, base_url=None, health_path=None,
                       deep_check=None, startup_timeout_s=10.0, steps=(sh(
                           "server", "echo loading weights; echo 'CUDA warning' >&2; "
                           "exec sleep 60"),))
    supervisor = ModelSupervisor(plan, on_health=lambda *_: None, job_id=config.job_id,
                                 policy=SupervisorPolicy(backoff_min_s=0.05))
    level = application.level
    application.addHandler(handler)
    application.setLevel(logging.INFO)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisor.run)
            await wait_until(lambda: shipper.pending >= 2, limit_s=10)
            nursery.cancel_scope.cancel()
    finally:
        application.removeHandler(handler)
        application.setLevel(level)
    records = {r.text: r for r in shipper._take()}
    stdout, stderr = records["loading weights"], records["CUDA warning"]
    assert (stdout.source, stdout.level, stdout.service, stdout.job_id) == (
        APPLICATION, logging.INFO, "agent-inference", config.job_id)
    assert (stderr.source, stderr.level) == (APPLICATION, logging.WARNING)


def test_application_lines_are_kept_as_written_and_long_ones_cut():
    config = agent_config(b"\x01" * 32)
    shipper = agent_shipper()
    handler = AgentLogHandler(shipper, config)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger = isolated_logger("tests.agent_logs.cut")
    logger.addHandler(handler)
    try:
        logger.info("%s", "x" * 20_000, extra={"source": "Application", "stream": "stdout"})
        logger.info("%s", "50% done", extra={"source": "Application", "stream": "stdout"})
        logger.error("the agent's own line")
        logging.getLogger("runtime.log_shipper").addHandler(handler)
        logging.getLogger("runtime.log_shipper").warning("push failed")  # never shipped
    finally:
        logger.removeHandler(handler)
        logging.getLogger("runtime.log_shipper").removeHandler(handler)
    long, percent, own = shipper._take()
    assert len(long.text) == MAX_TEXT_CHARS and long.text.endswith(CUT_MARKER)
    assert percent.text == "50% done" and percent.source == APPLICATION
    assert own.text == "ERROR tests.agent_logs.cut the agent's own line"
    assert own.source == SYSTEM and own.level == logging.ERROR


def test_shipping_is_installed_only_when_the_config_says_telemetry():
    logger = isolated_logger("tests.agent_logs.install")
    config = agent_config(b"\x01" * 32)
    assert install_log_shipping(config, logger=logger) is None
    assert logger.handlers == []
    installed = install_log_shipping(config.model_copy(update={"telemetry": True}),
                                     logger=logger)
    assert installed is not None
    shipper, handler = installed
    try:
        assert logger.handlers == [handler] and handler.shipper is shipper
        assert shipper.method is LOGS and shipper.max_records == AGENT_MAX_RECORDS
    finally:
        logger.removeHandler(handler)
