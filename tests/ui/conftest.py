"""The browser tests' fixtures: Debian's Chromium driven by Playwright, and one
``cosmicac up`` for the session (tests/ui/platform.py), started first."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .platform import Platform, platform_starting

#: Debian's chromium: `playwright install` would download a browser from a CDN.
#: Its headless shell first (the browser without the desktop shell, as Playwright's
#: own headless runs use): the same Blink and V8 for 15 % less CPU over the module.
CHROMIUM = os.environ.get("CHROMIUM") or next(
    (str(path) for path in (Path("/usr/lib/chromium/chromium-headless-shell"),
                            Path("/usr/lib/chromium/chromium")) if path.exists()),
    shutil.which("chromium"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if CHROMIUM is not None:
        return
    if os.environ.get("CAC_BROWSER_REQUIRED"):
        raise pytest.UsageError("CAC_BROWSER_REQUIRED is set but chromium is not "
                                "installed (bash .ci/run deps installs it)")
    skip = pytest.mark.skip(reason="chromium is not installed (bash .ci/run deps)")
    for item in items:
        if "tests/ui/" in str(item.path):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    return {**browser_type_launch_args, "executable_path": CHROMIUM}


@pytest.fixture(scope="session", autouse=True)
def platform_starting_up(tmp_path_factory: pytest.TempPathFactory
                         ) -> Iterator[Callable[[], Platform]]:
    """``up`` started before anything else of the session (autouse), so that its
    daemons start while Playwright's driver and the browser do."""
    with platform_starting(tmp_path_factory.mktemp("ui-platform")) as ready:
        yield ready


@pytest.fixture(scope="session")
def platform(platform_starting_up: Callable[[], Platform]) -> Platform:
    return platform_starting_up()


@pytest.fixture(scope="session")
def base_url(platform: Platform) -> str:
    return platform.url


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed browser test prints what the daemons said."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "platform" in item.fixturenames and call.when == "call":
        running = item.funcargs.get("platform")
        if running is not None:
            report.sections.append(("cosmicac up", running.logs()))
