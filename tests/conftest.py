"""Settings every test shares."""

from __future__ import annotations

import pytest


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
