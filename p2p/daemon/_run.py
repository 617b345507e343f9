"""Running a daemon: logging, storage lock, one metrics endpoint, clean stop on signals.

:func:`run_daemon` is the whole life of a daemon process after its settings
are loaded::

    configure logging ─ lock <storage>/LOCK ─ trio.run:
        serve metrics (if metrics.port) ─ start(daemon) ─ wait for SIGINT/SIGTERM
        ─ cancel everything (every ``finally`` runs) ─ log "<name>.stopped"

and maps its failures to one line on stderr and an exit code: 2 for a bad
setting, 1 for everything the operator must fix outside (busy port, folder in
use, read-only folder). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, NoReturn, TypeVar

import trio

from ..http import ServerBindError
from ..metrics import ProcessMetrics, serve_metrics
from ..net import Network
from ._lock import StorageInUse, StorageUnusable, lock_storage
from ._logging import configure_logging
from ._settings import ConfigError, DaemonSettings

__all__ = [
    "Daemon",
    "DaemonError",
    "fatal",
    "run_daemon",
    "run_until_signalled",
]

log = logging.getLogger("p2p.daemon")

S = TypeVar("S", bound=DaemonSettings)
#: Exit code of a bad setting or option (as click's usage errors).
EXIT_USAGE = 2
#: Exit code of a failure the operator fixes outside the daemon.
EXIT_FAILURE = 1


class DaemonError(Exception):
    """Ends the daemon with ``error: <message>`` on stderr and ``exit_code``.

    Raise it from a daemon's start function (or any task) for a failure the
    operator must fix: a port that cannot be bound, a database that does not
    open. Raised inside nurseries, it still ends the process with one line.
    """

    def __init__(self, message: str, *, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(" ".join(str(message).split()))
        self.exit_code = exit_code


def fatal(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``error: <message>`` (one line) on stderr and exit with ``code``."""
    sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    raise SystemExit(code)


@dataclass
class Daemon(Generic[S]):
    """What a running daemon's start function gets."""

    #: Its name, the prefix of the kit's log lines (``relay`` → ``relay.stopped``).
    name: str
    settings: S
    #: Start the daemon's tasks here; it is cancelled on SIGINT/SIGTERM.
    nursery: trio.Nursery
    #: Add each component's registry: the process serves them on one endpoint.
    metrics: ProcessMetrics
    #: The locked storage folder (absolute), or None.
    storage: Path | None
    #: Where the metrics endpoint listens, or None when it is off.
    metrics_address: tuple[str, int] | None = None
    #: Set once SIGINT or SIGTERM arrived (its name, e.g. ``SIGTERM``).
    stopped_by: str | None = field(default=None)
    #: Where its peer's sockets come from: None for the host's own; a
    #: ``p2p.net.MemoryInternet`` host when a test runs daemons in one process.
    network: Network | None = None


async def run_until_signalled(start: Callable[[trio.Nursery], Awaitable[object]]) -> str:
    """Run ``start(nursery)``, then wait for SIGINT or SIGTERM and cancel everything.

    Cancellation runs every ``finally`` (an announcer unannounces, sockets
    close) instead of a KeyboardInterrupt landing at a random point.

    Returns:
        The name of the signal that stopped it.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await start(nursery)
            async for signum in signals:
                nursery.cancel_scope.cancel()
                return signal.Signals(signum).name
    return "cancelled"  # pragma: no cover - the signal loop only ends by returning


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


ErrorMessages = Mapping[type[BaseException], Callable[[BaseException], str]]


def _exit_for(exc: BaseException, errors: ErrorMessages) -> NoReturn:
    """Turn a known failure (bare or in groups) into one line and an exit code."""
    leaves = [leaf for leaf in _leaves(exc) if not isinstance(leaf, trio.Cancelled)]
    known: list[tuple[BaseException, str | None, int]] = []
    for leaf in leaves:
        if isinstance(leaf, DaemonError):
            known.append((leaf, str(leaf), leaf.exit_code))
        elif isinstance(leaf, ConfigError):
            known.append((leaf, str(leaf), EXIT_USAGE))
        elif isinstance(leaf, ServerBindError | StorageInUse | StorageUnusable):
            # A server's bind error (metrics, a daemon's HTTP side) names its address.
            known.append((leaf, str(leaf), EXIT_FAILURE))
        elif isinstance(leaf, SystemExit) or isinstance(getattr(leaf, "exit_code", None), int):
            known.append((leaf, None, 0))  # already reported (typer.Exit, SystemExit)
        else:
            describe = next((fn for kind, fn in errors.items() if isinstance(leaf, kind)), None)
            if describe is None:
                raise exc  # a bug: keep the traceback
            known.append((leaf, describe(leaf), EXIT_FAILURE))
    if not known:
        raise exc
    leaf, message, code = known[0]
    if message is None:
        raise leaf from None
    fatal(message, code)


def run_daemon(
    settings: S,
    start: Callable[[Daemon[S]], Awaitable[object]],
    *,
    name: str,
    errors: ErrorMessages | None = None,
) -> None:
    """Run a daemon until SIGINT or SIGTERM; return once it stopped cleanly.

    Args:
        settings: from :func:`load_settings`.
        start: ``async def start(daemon)``: start the daemon's tasks in
            ``daemon.nursery`` (``await daemon.nursery.start(...)``), add their
            metrics registries to ``daemon.metrics``, print what the operator
            needs, and return. Raise :class:`DaemonError` for a failure.
        name: prefix of the kit's log lines.
        errors: messages for more exception types that end the process with
            exit 1 (``{OSError: lambda exc: f"cannot listen: {exc.strerror}"}``).

    Raises:
        SystemExit: after one ``error:`` line on stderr: 1 for a busy metrics
            or HTTP port (any :class:`~p2p.http.ServerBindError`), a storage
            folder in use or unusable, a :class:`DaemonError` (its
            ``exit_code``) or a type in ``errors``; 2 for a ``ConfigError``.
    """
    configure_logging(settings.log_level, format=settings.log_format)
    lock = None
    if settings.storage is not None:
        try:
            lock = lock_storage(settings.storage)
        except (StorageInUse, StorageUnusable) as exc:
            fatal(str(exc), EXIT_FAILURE)
    try:
        stopped_by = trio.run(functools.partial(
            _main, settings, start, name, lock.path if lock is not None else None))
    except KeyboardInterrupt:
        # SIGINT before the signal receiver was installed: trio delivered it
        # as KeyboardInterrupt and unwound everything; still a requested stop.
        stopped_by = "SIGINT"
    except (Exception, BaseExceptionGroup) as exc:
        _exit_for(exc, errors or {})
    finally:
        if lock is not None:
            lock.release()
    log.info("%s.stopped signal=%s", name, stopped_by)


async def _main(settings: S, start: Callable[[Daemon[S]], Awaitable[object]],
                name: str, storage: Path | None) -> str:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            daemon: Daemon[S] = Daemon(name, settings, nursery, ProcessMetrics(), storage)
            if settings.metrics.port:
                daemon.metrics_address = await nursery.start(functools.partial(
                    serve_metrics, daemon.metrics.registry, host=settings.metrics.host,
                    port=settings.metrics.port))
            await start(daemon)
            async for signum in signals:
                daemon.stopped_by = signal.Signals(signum).name
                log.info("%s.stopping signal=%s", name, daemon.stopped_by)
                nursery.cancel_scope.cancel()
                break
    return daemon.stopped_by or "cancelled"
