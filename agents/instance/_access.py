"""The keys that may open shells here now: a versioned set that only moves forward.

An agent starts with its config's ``authorized_keys`` (version
``shell_keys_version``, 0 for a config that names none), or with the newer set
it saved in its storage before a restart, and takes each newer set its worker
hands down (``agent.shell_keys``, :mod:`contracts.shell_access`). A set whose
version is not above the one held is ignored, so a redelivered or reordered
older set never gives a removed member their shell back.

I/O-free apart from :func:`load_saved` and :meth:`ShellAccess.save` (blocking,
small: call them in a thread from trio).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from contracts.model import key_hex
from p2p.daemon import write_atomically

__all__ = ["SAVED_NAME", "ShellAccess", "load_saved"]

log = logging.getLogger("agents.instance.access")

#: The file in the agent's storage that keeps the newest set across restarts.
SAVED_NAME = "shell_keys.json"


class ShellAccess:
    """Who may open shells: ``key in access``; :meth:`update` moves it forward.

    Args:
        keys: the starting keys (hex).
        version: their version (0: as the job was created).
    """

    def __init__(self, keys: Iterable[str] = (), version: int = 0) -> None:
        self.version = version
        self._keys = frozenset(bytes.fromhex(key_hex(key)) for key in keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    @property
    def keys(self) -> frozenset[bytes]:
        return self._keys

    def update(self, keys: Iterable[str], version: int) -> frozenset[bytes] | None:
        """Take ``keys`` at ``version`` if it is newer than the set held.

        Returns:
            The keys that lost access (empty if none), or None when ``version``
            is not above the one held (nothing changed).

        Raises:
            ValueError: a key is not 64 hex characters (nothing changed).
        """
        if version <= self.version:
            return None
        new = frozenset(bytes.fromhex(key_hex(key)) for key in keys)
        removed = self._keys - new
        self._keys, self.version = new, version
        return removed

    def to_json(self) -> bytes:
        return json.dumps({"version": self.version,
                           "keys": sorted(key.hex() for key in self._keys)}).encode()

    def save(self, folder: Path) -> None:
        """Keep the set in ``folder`` (0600, replaced atomically). Raises OSError."""
        write_atomically(folder / SAVED_NAME, self.to_json())


def load_saved(folder: Path) -> tuple[tuple[str, ...], int] | None:
    """The keys and version saved in ``folder``, or None (none, or unreadable: logged)."""
    path = folder / SAVED_NAME
    try:
        data = json.loads(path.read_bytes())
        keys = tuple(key_hex(key) for key in data["keys"])
        version = int(data["version"])
        if version < 0:
            raise ValueError("negative version")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("shell.saved_keys_unreadable path=%s reason=%s", path, exc)
        return None
    return keys, version
