"""Settings every test shares."""

from __future__ import annotations

import gc
import signal
import weakref
from typing import Any

import pytest
import typer
import typer.testing
from hypothesis import settings

from tests.examples import examples

# No per-example deadline: a property test checks what the code does, and its
# time is the benchmarks' business. On a busy machine (two suites at once) a
# 200 ms default deadline failed examples that pass alone, as flaky. A property
# that states no count gets hypothesis's 100, scaled as the others (tests/examples.py).
settings.register_profile("suite", deadline=None, max_examples=examples())
settings.load_profile("suite")


def _command_built_once_per_app() -> None:
    """typer's ``CliRunner.invoke`` turns the app into a click command on every
    call (some 40 ms for the whole CLI, about 5% of the CLI tests' CPU); the
    command depends only on the app, which no test changes once built."""
    built: weakref.WeakKeyDictionary[typer.Typer, Any] = weakref.WeakKeyDictionary()
    build = typer.testing._get_command

    def command(app: typer.Typer) -> Any:
        if app not in built:
            built[app] = build(app)
        return built[app]

    typer.testing._get_command = command


_command_built_once_per_app()


def _sigint_not_ignored() -> None:
    """A suite started as a background job (``make test &``, ``nohup``) inherits
    SIGINT ignored, and so would every process a test starts: Python keeps an
    inherited SIG_IGN, so a test's Ctrl-C to ``cosmicac`` would be lost and the
    test would time out. A handler is reset to the default at exec; an ignore is not."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_sigint_not_ignored()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (the project, every test module) lives until the
    worker ends: frozen out of the collector's reach, the full collections of a run
    stop walking it again (some 5% of the workers' CPU)."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked ``slow`` first, each module's order kept.

    ``make test`` hands whole modules to its workers in this order (--dist loadfile
    with --no-loadscope-reorder; xdist's own reorder puts the modules with the most
    tests first, which left the one-test end-to-end modules, the longest, for last:
    one worker ran them while the others had finished).
    """
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the user's real ``~/.config/cosmicac``.

    ``cosmicac up`` logs the local CLI in, and ``cosmicac login`` saves a
    session: run from a test, either would replace the developer's own.
    Subprocesses inherit the variable; tests that need a known folder set
    their own.
    """
    monkeypatch.setenv("COSMICAC_CONFIG_DIR", str(tmp_path_factory.mktemp("cosmicac-config")))
