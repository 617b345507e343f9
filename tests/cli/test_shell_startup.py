"""``cosmicac shell`` starts with what it runs: the client side of the shell, the
swarm's direct dial, Noise and the mux, and not what only daemons or other paths
use (the RPC layer and pydantic, the relay's client, the hole punch's messages,
the daemon settings, rich). Those cost ~0.25 s of a ``-- true`` run (bench/shell.py
``run_true``: 650 against 380 ms); a test here fails when one comes back.

The check runs in a fresh interpreter, which imports the client side, then runs
a command, then lists the modules it loaded. That run is also where a command's
stdout, stderr and exit status come back apart (test_shell.py's other sessions).
"""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager

import trio

from agents.instance import ShellService
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.swarm import Swarm, SwarmConfig

#: Loaded by neither ``import cli.shell`` nor a run of ``shell --address ... -- true``
#: (typer is pinned below 0.29, which coerced every option through pydantic).
NOT_FOR_A_SHELL = ("pydantic", "pydantic_settings", "p2p.rpc", "p2p.relay._client",
                   "p2p.relay._messages", "p2p.punch._messages", "p2p.daemon", "cli.dht",
                   "rich", "httpx")

_LOADED = """
def loaded(names):
    import sys
    return sorted(m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in names))
"""

#: The command closes its stdout when the remote's ends: the list goes to a file.
_RUN_PROBE = _LOADED + """
import atexit, pathlib, sys
atexit.register(lambda: pathlib.Path({into!r}).write_text("LOADED " + str(loaded({names!r}))))
import cli.shell
import agents.instance
from agents.instance import Exit, ShellSession, Stderr, keep_large_buffers, open_shell
from p2p.swarm import Swarm, SwarmConfig
sys.argv[0] = "cosmicac"
from cli.main import main
main()
"""

LIMIT_S = 60


@asynccontextmanager
async def agent(tmp_path):
    """A swarm on 127.0.0.1 serving shells to ``tmp_path/user``; yields the CLI's
    arguments that reach it."""
    user = load_or_create_keypair(tmp_path / "user")
    swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", announce_key=False),
                  services=[ShellService({user.public_key}.__contains__, shell="/bin/sh")])
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(swarm.run)
        yield ["shell", "--agent", swarm.public_key.hex(), "--address", f"{host}:{port}",
               "--identity", str(tmp_path / "user")]
        nursery.cancel_scope.cancel()


async def test_the_shell_client_and_a_command_at_an_address_load_none_of_the_daemon_side(
        tmp_path):
    """Importing the client side (cli.shell, agents.instance's session and the swarm),
    then a run of ``shell --address ... -- CMD``, loads none of NOT_FOR_A_SHELL; the
    command's stdout, stderr and exit status come back apart."""
    with trio.fail_after(LIMIT_S):
        async with agent(tmp_path) as args:
            into = tmp_path / "loaded"
            probe = _RUN_PROBE.format(names=NOT_FOR_A_SHELL, into=str(into))
            result = await trio.run_process(
                [sys.executable, "-c", probe, *args, "--", "sh", "-c",
                 "echo out; echo err >&2; exit 3"],
                stdin=b"", capture_stdout=True, capture_stderr=True, check=False)
    # The session ran: the agent's output came back, each stream on its own.
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert into.read_text() == "LOADED []"
