"""agent-instance: shells for a GPU Container Job's team (the hyperswarm-ssh analogue).

The agent adds a :class:`ShellService` to its swarm; ``cosmicac shell`` calls
:func:`open_shell` on its connection to the agent. See README.md for the wire
format of ``cosmicac-shell/1``.
"""

from ._access import ShellAccess, load_saved
from ._client import ShellSession, open_shell
from ._descendants import Descendants, become_subreaper
from ._malloc import keep_large_buffers
from ._protocol import (
    PROTOCOL,
    Exit,
    RemoteProtocolError,
    ShellError,
    Stderr,
    Stdout,
    decode_client,
    decode_server,
    encode,
)
from ._server import ShellService

__all__ = [
    "PROTOCOL", "Descendants", "Exit", "RemoteProtocolError", "ShellAccess", "ShellError",
    "ShellService", "ShellSession", "Stderr", "Stdout", "become_subreaper", "decode_client",
    "decode_server", "encode", "keep_large_buffers", "load_saved", "open_shell",
]
