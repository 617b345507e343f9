"""agent-instance: shells for a GPU Container Job's team (the hyperswarm-ssh analogue).

The agent adds a :class:`ShellService` to its swarm; ``cosmicac shell`` calls
:func:`open_shell` on its connection to the agent. See README.md for the wire
format of ``cosmicac-shell/1``.
"""

from p2p.lazy import lazy_names

#: Each name, and the module that defines it: imported on first use (PEP 562), so
#: ``cosmicac shell``, which needs the client side only, does not load the agent's
#: server side (its swarm host, the contracts' models: ~0.3 s of start-up).
_WHERE = {
    "ShellAccess": "._access", "load_saved": "._access",
    "ShellSession": "._client", "open_shell": "._client",
    "Descendants": "._descendants", "become_subreaper": "._descendants",
    "keep_large_buffers": "._malloc",
    "PROTOCOL": "._protocol", "Exit": "._protocol", "RemoteProtocolError": "._protocol",
    "ShellError": "._protocol", "Stderr": "._protocol", "Stdout": "._protocol",
    "decode_client": "._protocol", "decode_server": "._protocol", "encode": "._protocol",
    "ShellService": "._server",
}


__getattr__ = lazy_names(__name__, _WHERE, globals())


__all__ = [
    "PROTOCOL", "Descendants", "Exit", "RemoteProtocolError", "ShellAccess", "ShellError",
    "ShellService", "ShellSession", "Stderr", "Stdout", "become_subreaper", "decode_client",
    "decode_server", "encode", "keep_large_buffers", "load_saved", "open_shell",
]
