"""Where the CLI keeps the user's things: a light module, imported by every command.

(It lived in ``cli/run.py``, whose imports of the daemon kit cost every API
command about half a second.)
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["config_dir"]


def config_dir(option: Path | None) -> Path:
    """``option``, else ``$COSMICAC_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/cosmicac``
    (``~/.config/cosmicac``): the session, the CLI's identity, installed configs."""
    if option is not None:
        return option
    env = os.environ.get("COSMICAC_CONFIG_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME")
    return (Path(base) if base else Path.home() / ".config") / "cosmicac"
