"""A daemon written on the kit, run as a real process by test_run.py.

``python -m tests.p2p.daemon.example_daemon [--config FILE] [--port N]``
prints ``ready <metrics port or 0>`` on stdout once started.
"""

from __future__ import annotations

import sys

import trio
from prometheus_client import Counter
from pydantic_settings import SettingsConfigDict

from p2p.daemon import (
    ConfigError,
    Daemon,
    DaemonError,
    DaemonSettings,
    Port,
    PublicKeyList,
    fatal,
    load_settings,
    run_daemon,
)
from p2p.metrics import CollectorRegistry


class ExampleSettings(DaemonSettings):
    model_config = SettingsConfigDict(env_prefix="COSMICAC_EXAMPLE__")
    port: Port = 4000
    relays: PublicKeyList = ()
    fail_with: str = ""


async def start(daemon: Daemon[ExampleSettings]) -> None:
    if daemon.settings.fail_with == "daemon-error":
        raise DaemonError("the example cannot start")
    if daemon.settings.fail_with == "os-error":
        async def fails() -> None:
            raise OSError(98, "Address already in use")
        daemon.nursery.start_soon(fails)
        await trio.sleep_forever()
    registry = CollectorRegistry()
    Counter("example_starts", "starts", registry=registry).inc()
    daemon.metrics.add(registry)
    port = daemon.metrics_address[1] if daemon.metrics_address else 0
    print(f"ready {port} {daemon.settings.port} {len(daemon.settings.relays)}", flush=True)


def main(argv: list[str]) -> None:
    config = argv[argv.index("--config") + 1] if "--config" in argv else None
    overrides = {"port": int(argv[argv.index("--port") + 1])} if "--port" in argv else {}
    try:
        settings = load_settings(ExampleSettings, config_file=config, overrides=overrides)
    except ConfigError as exc:
        fatal(str(exc), 2)
    run_daemon(settings, start, name="example",
               errors={OSError: lambda exc: f"cannot listen: {exc.strerror}"})


if __name__ == "__main__":
    main(sys.argv[1:])
