"""Where the CLI keeps the user's things: a light module, imported by every command.

(It lived in ``cli/run.py``, whose imports of the daemon kit cost every API
command about half a second.)
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["config_dir", "write_private"]


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


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``path`` atomically, readable by its owner alone (the default mode):
    sessions, API keys, passwords and daemon configs go through here.

    The temporary file is created 0600, so the secret is never readable by
    others even for a moment; a crash leaves the old file whole. A missing
    folder is made 0700; an existing one is left as its maker set it (``up``'s
    and ``bootstrap``'s deployment folder is 0711, for the local agents' own
    users, and the file is 0600 either way).
    """
    from p2p.files import private_folder, write_atomically

    if not path.parent.is_dir():
        private_folder(path.parent)
    write_atomically(path, text.encode(), mode=mode)
