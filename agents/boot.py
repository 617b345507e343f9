"""The agent process: ``cosmicac agent run --config FILE``, on the daemon kit.

Boot order, each step refusing with one line and an exit code:

1. read the config (:func:`contracts.agent_config.load_agent_config`, the model the
   worker rendered); a bad file or field: exit 2, naming the field;
2. lock the storage folder (one agent per folder) and load or create the
   identity in ``<storage>/identity`` (:func:`p2p.keys.load_or_create_keypair`,
   as ``cosmicac db serve`` and the relay keep theirs), so a restarted VMI,
   whose disk is kept, comes back with the same key;
3. run :class:`agents._agent.Agent` until SIGTERM or SIGINT (exit 0); a
   Managed Inference Job's agent runs its model server
   (:class:`agents.inference.InferenceWorkload`). With ``telemetry`` in the
   config, the process's log records (its own as System, the model server's
   output as Application) are shipped to the worker (``agents/_logs.py``).

Exit 1: the worker refused the agent for good (:class:`AgentRefused`), the
workload failed (:class:`AgentGaveUp`), the identity or storage is unusable.

``python -m agents.boot [--config FILE]`` is the same agent without the CLI's
machinery (typer's dispatch costs 15 to 50 ms of a start): what the ``local``
backend's fork server runs.
Settings the kit adds (metrics endpoint, log format) come from
``COSMICAC_AGENT__<KEY>`` in the environment; the rest is the config file's.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic_settings import SettingsConfigDict

from contracts.agent_config import (
    AGENT_CONFIG_PATH,
    AgentConfig,
    AgentConfigError,
    load_agent_config,
)
from contracts.model import JobType
from p2p.daemon import (
    ConfigError,
    Daemon,
    DaemonError,
    DaemonSettings,
    fatal,
    load_settings,
    run_daemon,
)
from p2p.errors import P2PError
from p2p.keys import load_or_create_keypair

from ._agent import Address, Agent, AgentGaveUp, AgentRefused, Readiness
from ._logs import install_log_shipping
from .inference._launcher import StepLauncher, prefork

__all__ = ["AgentProcessSettings", "main"]

#: Exit code of a bad config (as the kit's ConfigError and click's usage errors).
EXIT_USAGE = 2


class AgentProcessSettings(DaemonSettings):
    """The kit's part of the agent's settings (storage and log level come from the
    agent config; metrics and log format from ``COSMICAC_AGENT__...``)."""

    model_config = SettingsConfigDict(env_prefix="COSMICAC_AGENT__")


def main(config_path: str | Path, *, readiness: Readiness | None = None) -> None:
    """Run the agent of ``config_path`` until SIGTERM/SIGINT; return (exit 0) then.

    Args:
        config_path: the JSON the worker wrote (cloud-init, or the local backend).
        readiness: the workload's readiness hook (see :class:`agents._agent.Agent`).

    Raises:
        SystemExit: 2 for a bad config, 1 for the failures listed in the module doc.
    """
    try:
        config = load_agent_config(config_path)
    except AgentConfigError as exc:
        fatal(str(exc), EXIT_USAGE)
    try:
        settings = load_settings(AgentProcessSettings, overrides={
            "storage": Path(config.storage), "log_level": config.log_level})
    except ConfigError as exc:
        fatal(str(exc), EXIT_USAGE)
    # Before trio starts (one thread): our own model server is forked from here.
    launcher = prefork(config) if readiness is None else None
    start = functools.partial(_start, config, config.bootstrap, config.worker_addresses,
                              readiness, launcher)
    run_daemon(settings, start, name="agent", errors={
        AgentRefused: str,
        AgentGaveUp: lambda exc: f"the workload failed: {exc}",
        OSError: lambda exc: f"cannot listen: {getattr(exc, 'strerror', None) or exc}",
    })


async def _start(config: AgentConfig, bootstrap: tuple[Address, ...],
                 worker_addresses: tuple[Address, ...], readiness: Readiness | None,
                 launcher: StepLauncher | None, daemon: Daemon[AgentProcessSettings]) -> None:
    assert daemon.storage is not None
    try:
        keypair = load_or_create_keypair(daemon.storage)
    except P2PError as exc:
        raise DaemonError(str(exc)) from None
    workload = None
    if config.job_type is JobType.CONTAINER:
        from agents.instance import keep_large_buffers

        keep_large_buffers()  # shells move bulk output in 256 KiB frames
    if config.job_type is JobType.INFERENCE and readiness is None:
        from agents.inference import InferenceWorkload

        workload = InferenceWorkload(config, launcher=launcher)
    # After the kit configured logging (it replaces the root's handlers); the
    # handler stays for the process's life.
    shipping = install_log_shipping(config)
    agent = Agent(config, keypair, bootstrap=bootstrap, worker_addresses=worker_addresses,
                  readiness=readiness, workload=workload,
                  shipper=shipping[0] if shipping is not None else None,
                  state_dir=daemon.storage,
                  keep_descendants=config.job_type is JobType.CONTAINER)
    daemon.metrics.add(agent.swarm.metrics.registry)
    await daemon.nursery.start(agent.run)


def command_line(argv: Sequence[str]) -> None:
    """``python -m agents.boot [--config FILE]``: :func:`main`, as ``cosmicac agent
    run`` calls it (the same default file, ``COSMICAC_AGENT_CONFIG``, and the same
    environment for the model server: unbuffered output)."""
    parser = argparse.ArgumentParser(prog="python -m agents.boot",
                                     description="The job agent (cosmicac agent run).")
    parser.add_argument("--config", default=os.environ.get("COSMICAC_AGENT_CONFIG",
                                                           AGENT_CONFIG_PATH),
                        help="the agent config the worker wrote (JSON)")
    args = parser.parse_args(argv)  # a usage error exits 2, as the CLI's do
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # as cosmicac's CLI sets it
    main(args.config)


if __name__ == "__main__":
    command_line(sys.argv[1:])
