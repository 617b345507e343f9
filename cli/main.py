"""The ``cosmicac`` command: one typer app, one module per command group."""

from __future__ import annotations

import logging
import os

import typer

from . import agent, db, dht, k8s, keys, relay
from .beam import beam
from .node import ping, up
from .run import apply_config, run
from .shell import shell

app = typer.Typer(
    name="cosmicac",
    help="CosmicAC: GPU workloads on your cluster, over a peer-to-peer stack.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(keys.app, name="keys")
app.add_typer(dht.app, name="dht")
app.add_typer(db.app, name="db")
app.add_typer(agent.app, name="agent")
app.add_typer(k8s.app, name="k8s")
app.command("run")(run)
app.command("apply-config")(apply_config)
app.command("beam")(beam)
app.command("up")(up)
app.command("ping")(ping)
app.command("relay")(relay.relay)
app.command("shell")(shell)


@app.callback()
def _configure(
    log_level: str = typer.Option(
        "warning", "--log-level", envvar="COSMICAC_LOG_LEVEL", help="debug, info, warning, error"
    ),
) -> None:
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":
    main()
