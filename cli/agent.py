"""``cosmicac agent``: the in-VM job agent (and the ``local`` backend's simulated VMIs).

The worker renders the agent's config (:class:`contracts.agent_config.AgentConfig`):
into the VMI's cloud-init user data, which writes it to
:data:`contracts.agent_config.AGENT_CONFIG_PATH`, or, on the ``local`` backend, into
the simulated VMI's storage folder, and starts ``cosmicac agent run --config
FILE`` there.
"""

from __future__ import annotations

from pathlib import Path

import typer

from contracts.agent_config import AGENT_CONFIG_PATH

__all__ = ["app"]

app = typer.Typer(help="The job agent that runs in each VMI and reports to its worker.",
                  no_args_is_help=True)


@app.command("run")
def run(
    config: Path = typer.Option(
        Path(AGENT_CONFIG_PATH), "--config", dir_okay=False, envvar="COSMICAC_AGENT_CONFIG",
        help="The agent config the worker wrote (JSON)."),
) -> None:
    """Join the swarm, report to the worker until SIGTERM (exit 0).

    Exit 2: the config is unreadable or a field is wrong (named); exit 1: the
    worker refused this agent, its workload failed, or its storage is unusable.

    Example: cosmicac agent run --config /etc/cosmicac/agent.json
    """
    from agents.boot import main  # the agent's imports only when it runs

    main(config)
