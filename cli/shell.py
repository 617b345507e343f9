"""``cosmicac shell``: a shell (or one command) on a GPU Container Job's agent.

The ssh of CosmicAC. ``cosmicac shell JOB [-- CMD]`` asks app-node (the
logged-in session, ``GET /api/jobs/JOB``) for the job's agent: the first
agent of replica ``--replica`` (0), which must be a running container job;
and, unless ``--address`` or ``--bootstrap`` says where to look,
``GET /api/swarm`` for the DHT bootstrap and the relays' keys. ``--agent KEY``
instead of JOB names the agent directly (no app-node involved).

The user's identity (``--identity``, by default the CLI's ``<config
dir>/user``, which ``cosmicac login`` registers so the team's container jobs
list it in their ``authorized_keys``) dials the agent's key over a swarm, at
``--address`` if given, else through the DHT, else through the relays; then
one ``cosmicac-shell/1`` session runs on that connection:

* interactive (no command and stdin is a terminal, or ``-t``): the local
  terminal goes raw (restored on every way out), the agent gets ``$TERM`` and
  the window size, SIGWINCH becomes RESIZE, bytes flow both ways;
* exec (``-- CMD ARGS``, or stdin is not a terminal): the command runs on
  pipes, its stdout and stderr arrive apart, stdin's end is its end of input.

Either way the exit status is the remote one (128+N for a signal N), as ssh's
is. Our own failures (not logged in, no such job, a job not running or not a
container job, the agent unreachable, our key refused, the session broken)
print one line and exit 255, as ssh does, so a script can tell them from the
command's own status; usage errors exit 2.

Backpressure: the next chunk of stdin is read only once the agent took the
last (the mux's credit), and the next output frame only once the terminal or
pipe took the last; nothing queues here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat
import struct
import termios
import tty
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import trio
import typer

from agents.instance import (
    Exit,
    ShellError,
    ShellSession,
    Stderr,
    keep_large_buffers,
    open_shell,
)
from p2p.errors import P2PError
from p2p.keys import KeyPair, format_key, load_or_create_keypair, parse_public_key
from p2p.mux import MuxError
from p2p.swarm import Connection, Swarm, SwarmConfig, SwarmError

from ._args import parse_address, parse_key, wildcard_for
from ._completion import container_job_ids
from ._config import config_dir
from ._console import fail, run_trio
from ._stdio import StdinSource, StdoutSink
from .session import api_for, server_option

__all__ = ["JobTarget", "resolve_job", "shell"]

#: ssh's status for its own failures (unreachable, refused, broken session).
FAILED = 255
#: A command the agent could not start (ssh's remote shell says 127 too).
NOT_FOUND = 127
#: What runs when stdin is not a terminal and no command was given (ssh runs the
#: login shell on pipes; the agent's own $SHELL needs a PTY session).
_PIPE_SHELL = ("sh",)
_TERM_FALLBACK = "xterm-256color"


def parse_bootstrap(text: str) -> list[tuple[str, int]]:
    """:func:`cli.dht.parse_bootstrap`, imported on first use: ``cli.dht`` brings the
    daemon settings (pydantic-settings, ~0.1 s of start-up) that a shell at an
    ``--address`` never needs."""
    from .dht import parse_bootstrap

    return parse_bootstrap(text)


def shell(
    job: str | None = typer.Argument(
        None, metavar="JOB", show_default=False,
        help="The container job's id (`cosmicac jobs list`); not with --agent.",
        autocompletion=container_job_ids),
    arguments: list[str] | None = typer.Argument(
        None, metavar="[-- CMD ARGS...]",
        help="A command to run instead of an interactive shell (put it after --)."),
    agent: str | None = typer.Option(
        None, "--agent", "-k", envvar="COSMICAC_AGENT",
        help="The agent's public key (64 hex characters) instead of a JOB."),
    replica: int = typer.Option(
        0, "--replica", min=0, help="Which replica of JOB (its index); default 0."),
    server: str | None = server_option(),
    address: list[str] | None = typer.Option(
        None, "--address", "-a", help="The agent's HOST:PORT (repeatable); skips the DHT."),
    bootstrap: list[str] | None = typer.Option(
        None, "--bootstrap", "-b", envvar="COSMICAC_DHT_BOOTSTRAP",
        help="DHT bootstrap HOST:PORT[,...] (repeatable): find the agent by its key."),
    relay: list[str] | None = typer.Option(
        None, "--relay", "-r", envvar="COSMICAC_RELAYS",
        help="Blind relay KEY[@HOST:PORT][,...] (repeatable) to come through when the "
             "agent cannot be reached directly; without @HOST:PORT the relay is found "
             "on the DHT (needs --bootstrap)."),
    identity: Path | None = typer.Option(
        None, "--identity", "-i", envvar="COSMICAC_IDENTITY",
        help="Folder of your identity, created if absent (default: "
             "$COSMICAC_CONFIG_DIR/user, else ~/.config/cosmicac/user). Its public key "
             "(`cosmicac keys show --storage DIR`) must be one of the job's authorised keys."),
    force_tty: bool = typer.Option(
        False, "--tty", "-t", help="Run the command on a terminal (like ssh -t)."),
    no_tty: bool = typer.Option(
        False, "--no-tty", "-T", help="Never a terminal, even for an interactive shell."),
) -> None:
    """Open a shell on a GPU Container Job's agent, or run one command there.

    JOB's agent and the swarm's bootstrap come from app-node (log in first);
    with --agent every argument is the command.

    Exits with the remote status (128+N if a signal N ended it; 127 if the
    command could not start); 255 if the job cannot be used (not logged in,
    unknown, not running, not a container job), or the agent cannot be
    reached or refuses your key; 2 for usage errors.

    Example: cosmicac shell j-5d1c2b7a9e0f4c11

    Example: cosmicac shell j-5d1c2b7a9e0f4c11 --replica 1 -- nvidia-smi -L

    Example: cosmicac shell --agent 9f2c...e1 --address 10.0.0.7:49737 -- uptime
    """
    argv = list(arguments or [])
    if agent is not None and job is not None:
        argv, job = [job, *argv], None  # with --agent, the command starts at once
    if agent is None and job is None:
        fail("name the job: cosmicac shell JOB [-- CMD] (or give an agent's key with "
             "--agent KEY)", code=2)
    if force_tty and no_tty:
        fail("--tty and --no-tty exclude each other", code=2)
    try:
        addresses = [parse_address(item.strip()) for text in address or ()
                     for item in text.split(",") if item.strip()]
    except typer.BadParameter as exc:
        fail(f"bad --address: {exc}", code=2)
    dht = [a for text in bootstrap or () for a in parse_bootstrap(text)]
    relays, relay_addresses = _parse_relays(relay or ())
    if job is not None:
        target = resolve_job(server, job, replica, swarm=not addresses and not dht)
        agent_key, dht = target.agent, dht or target.bootstrap
        if not relays:
            relays, relay_addresses = target.relays, target.relay_addresses
    else:
        assert agent is not None
        agent_key = parse_key(agent, what="agent key")
        if not addresses and not dht:
            fail("give the agent's --address HOST:PORT, or --bootstrap to find it by key",
                 code=2)
    if any(key not in relay_addresses for key in relays) and not dht:
        fail("a --relay without @HOST:PORT needs --bootstrap (it is found on the DHT)",
             code=2)
    folder = identity or config_dir(None) / "user"
    try:
        keypair = load_or_create_keypair(folder)
    except P2PError as exc:
        fail(str(exc))
    stdin_tty = os.isatty(0)
    pty = force_tty or (not no_tty and not argv and stdin_tty)
    if not argv and not pty:
        argv = list(_PIPE_SHELL)
    keep_large_buffers()  # bulk output: a quarter of our CPU went to mmap/munmap
    plan = _Plan(keypair, agent_key, addresses, dht, relays, argv or None, pty,
                 raw=pty and stdin_tty, relay_addresses=relay_addresses)
    code = _run(plan)
    raise typer.Exit(code)


# -- JOB -> its agent, through app-node ------------------------------------------


@dataclass(frozen=True)
class JobTarget:
    """Where a job's shell is: its agent's key, and how to find it on the swarm."""

    agent: bytes
    #: From ``GET /api/swarm`` (empty when not asked for).
    bootstrap: list[tuple[str, int]]
    relays: list[bytes]
    #: Where relays listen, by key: paired through with no DHT.
    relay_addresses: dict[bytes, list[tuple[str, int]]] = field(default_factory=dict)


def _parse_relays(texts: Iterable[str]
                  ) -> tuple[list[bytes], dict[bytes, list[tuple[str, int]]]]:
    """``--relay`` items, ``KEY`` or ``KEY@HOST:PORT``: the keys, and the addresses given."""
    keys: list[bytes] = []
    where: dict[bytes, list[tuple[str, int]]] = {}
    for text in texts:
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            key_text, _, address = item.partition("@")
            key = parse_key(key_text, what="relay key")
            if key not in keys:
                keys.append(key)
            if address:
                try:
                    where.setdefault(key, []).append(parse_address(address))
                except typer.BadParameter as exc:
                    fail(f"bad --relay address {address!r}: {exc}", code=2)
    return keys, where


@contextlib.contextmanager
def _ssh_failure() -> Iterator[None]:
    """A failure of the API client (its line already printed, exit 1, 2, 3 or 4)
    exits 255 instead: ``cosmicac shell`` exits with the command's status, so its
    own failures must not look like one."""
    try:
        yield
    except typer.Exit as exc:
        if exc.exit_code:
            raise typer.Exit(FAILED) from None
        raise


def resolve_job(server: str | None, job: str, replica: int = 0, *,
                swarm: bool = True) -> JobTarget:
    """The agent of ``replica`` of container job ``job``, as app-node reports it.

    Args:
        server: ``--server`` (else the session's).
        job: the job's id.
        replica: the replica's index.
        swarm: also ask ``GET /api/swarm`` for the bootstrap and relays.

    Raises:
        typer.Exit: 255 after one line on stderr: not logged in, no such job,
            not a container job, not running, no such replica, no agent yet,
            no bootstrap advertised; or app-node unreachable.
    """
    with _ssh_failure():
        api = api_for(server)
        view = api.get(f"/jobs/{quote(job, safe='')}")
    if view.get("type") != "container":
        fail(f"job {job} is an {view.get('type')} job: it serves a model, it has no shell "
             f"(use `cosmicac inference chat --model NAME`)", code=FAILED)
    if view.get("status") != "running":
        fail(f"job {job} is {view.get('status')}, not running: a shell needs a running "
             f"job (watch it with `cosmicac jobs get {job}`)", code=FAILED)
    found = [r for r in view.get("replicas") or () if r.get("index") == replica]
    if not found:
        fail(f"job {job} has no replica {replica}", code=FAILED)
    agents = found[0].get("agents") or []
    if not agents:
        fail(f"replica {replica} of job {job} has no agent yet (it has not said hello); "
             f"try again in a moment", code=FAILED)
    try:
        agent = parse_public_key(agents[0], what="agent key")
    except P2PError as exc:
        fail(f"app-node lists a bad agent key for job {job}: {exc}", code=FAILED)
    if not swarm:
        return JobTarget(agent, [], [])
    with _ssh_failure():
        advert = api.get("/swarm")
        bootstrap = [a for item in advert.get("bootstrap") or ()
                     for a in parse_bootstrap(item)]
        relays = [parse_key(item, what="relay key") for item in advert.get("relays") or ()]
        relay_addresses = {
            parse_key(key, what="relay key"): [a for item in items or ()
                                               for a in parse_bootstrap(item)]
            for key, items in (advert.get("relay_addresses") or {}).items()}
    if not bootstrap and not relay_addresses:
        fail("app-node advertises no DHT bootstrap and no relay address (its "
             "cli_bootstrap, bootstrap and relay_addresses settings): give --bootstrap "
             "HOST:PORT, --relay KEY@HOST:PORT or the agent's --address HOST:PORT",
             code=FAILED)
    return JobTarget(agent, bootstrap, relays, relay_addresses)


class _Plan:
    """What the command line asked for, parsed."""

    def __init__(self, keypair: KeyPair, agent: bytes, addresses: list[tuple[str, int]],
                 bootstrap: list[tuple[str, int]], relays: list[bytes],
                 argv: list[str] | None, pty: bool, raw: bool,
                 relay_addresses: dict[bytes, list[tuple[str, int]]] | None = None) -> None:
        self.keypair, self.agent = keypair, agent
        self.addresses, self.bootstrap, self.relays = addresses, bootstrap, relays
        self.relay_addresses = relay_addresses or {}
        self.argv, self.pty, self.raw = argv, pty, raw


def _run(plan: _Plan) -> int:
    result: list[int] = []
    try:
        run_trio(_main, plan, result)
    except KeyboardInterrupt:  # ^C while connecting (later, SIGINT goes to the agent)
        return 128 + signal.SIGINT
    return result[0] if result else FAILED


# -- the terminal -----------------------------------------------------------------


@contextlib.contextmanager
def _raw_terminal(fd: int | None) -> Iterator[None]:
    """Put the terminal ``fd`` in raw mode; restore it however we leave."""
    if fd is None:
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _window_size(fd: int) -> tuple[int, int]:
    """(rows, cols) of the terminal ``fd``; 24x80 when it has none."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return 24, 80
    return (rows or 24, cols or 80)


def _term() -> str:
    term = os.environ.get("TERM", "")
    ok = term and len(term) <= 64 and all(c.isalnum() or c in ".+_-" for c in term)
    return term if ok else _TERM_FALLBACK


# -- the session ------------------------------------------------------------------


async def _main(plan: _Plan, result: list[int]) -> None:
    if os.isatty(2):
        from ._console import err  # (rich: only for a terminal, see cli._console)

        err.print(f"connecting to {format_key(plan.agent)[:12]} …", markup=False)
    reached = [*plan.bootstrap, *(a for where in plan.relay_addresses.values() for a in where)]
    host = wildcard_for(reached) if reached else "127.0.0.1"
    config = SwarmConfig(host=host, bootstrap=tuple(plan.bootstrap), announce_key=False,
                         lookup_max_s=5.0, dht_in_background=bool(plan.relay_addresses),
                         known_peers=tuple((key, tuple(where))
                                           for key, where in plan.relay_addresses.items()))
    swarm = Swarm(plan.keypair, config=config)
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(swarm.run)
        except OSError as exc:
            fail(f"cannot open a local socket: {exc.strerror or exc}", code=FAILED)
        connection = await _connect(swarm, plan)
        session = await _open(connection, plan)
        try:
            # Raw only while the session runs: our own lines (progress, errors)
            # print on a terminal in its usual mode.
            with _raw_terminal(0 if plan.raw else None):
                outcome = await _drive(session, plan)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await session.aclose()
        if isinstance(outcome, str):
            fail(outcome, code=FAILED)
        result.append(outcome)
        nursery.cancel_scope.cancel()


async def _connect(swarm: Swarm, plan: _Plan) -> Connection:
    """The connection to the agent: its addresses, then the DHT, then the relays."""
    label = format_key(plan.agent)[:12]
    failures: list[str] = []
    attempts = []
    if plan.addresses:
        attempts.append(("", lambda: swarm.connect(plan.agent, addresses=plan.addresses)))
    through_dht = ("DHT: ", lambda: swarm.connect(plan.agent))
    through_relays = ("relays: ", lambda: _via_relays(swarm, plan))
    dht_joined = swarm.dht is not None and len(swarm.dht.core.routing) > 0
    if plan.relays and plan.relay_addresses and not dht_joined:
        # The DHT is still joining, or out of reach (a workstation behind a
        # firewall): the relay, known by its address, answers at once, and a
        # hole punch moves the session to a direct path if the networks allow.
        attempts.append(through_relays)
        if plan.bootstrap:
            attempts.append(through_dht)
    else:
        if plan.bootstrap:
            attempts.append(through_dht)
        if plan.relays:
            attempts.append(through_relays)
    for how, attempt in attempts:
        try:
            return await attempt()
        except SwarmError as exc:
            failures.append(how + str(exc))
    fail(f"cannot reach agent {label}: {'; '.join(failures)}", code=FAILED)


async def _via_relays(swarm: Swarm, plan: _Plan) -> Connection:
    # The swarm dials relays a record lists; these come from the command line.
    return await swarm.connect(plan.agent, relays=plan.relays)


async def _open(connection: Connection, plan: _Plan) -> ShellSession:
    label = format_key(plan.agent)[:12]
    mine = format_key(plan.keypair.public_key)
    rows, cols = _window_size(0 if os.isatty(0) else 1)
    try:
        return await open_shell(connection, argv=plan.argv, pty=plan.pty, term=_term(),
                                rows=rows, cols=cols)
    except ShellError as exc:
        if exc.code == "unauthorized":
            fail(f"agent {label} refused key {mine}: it is not one of the job's "
                 f"authorised keys", code=FAILED)
        if exc.code == "spawn_failed":  # as a shell says "command not found"
            fail(f"{plan.argv[0] if plan.argv else 'the shell'}: {exc.message}",
                 code=NOT_FOUND)
        fail(f"agent {label} did not start the session ({exc.code}): {exc.message}",
             code=FAILED)
    except (P2PError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        # The agent's firewall ends the connection of a key it does not know
        # right after the handshake, before any channel opens.
        fail(f"agent {label} closed the connection: key {mine} is not one of the job's "
             f"authorised keys ({type(exc).__name__})", code=FAILED)


async def _drive(session: ShellSession, plan: _Plan) -> int | str:
    """Move bytes until the remote process exits; its status as ours, or why
    the session broke."""
    stdin = StdinSource()
    _grow_pipe(1)
    stdout = StdoutSink()
    stderr = StdoutSink(os.dup(2))  # a copy: our own errors still go to fd 2
    exit_: Exit | None = None
    broken = ""
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_upload, session, stdin)
            nursery.start_soon(_signals, session, plan.raw)
            reading = True  # stdout broke: the rest is dropped (the process got SIGHUP)
            async for event in session:
                sink = stderr if isinstance(event, Stderr) else stdout
                if not reading and sink is stdout:
                    continue
                try:
                    await sink.send_all(event.data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    if sink is stdout:
                        reading = False
                        with _agent_may_be_gone():
                            await session.signal("HUP")  # as ssh, whose reader went away
            exit_ = await session.wait_exit()
            nursery.cancel_scope.cancel()
    except* (ShellError, MuxError, P2PError, trio.BrokenResourceError) as group:
        if exit_ is None:
            leaf = group.exceptions[0]
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            broken = f"the session with agent {format_key(plan.agent)[:12]} broke: {leaf}"
    finally:
        for stream in (stdin, stdout, stderr):
            with contextlib.suppress(OSError, trio.BrokenResourceError):
                await stream.aclose()
    if exit_ is None:
        return broken or "the session ended without an exit status"
    return exit_.code if exit_.code is not None else 128 + (exit_.signal or 0)


def _grow_pipe(fd: int) -> None:
    """Let a pipe on ``fd`` hold 1 MiB (Linux's default pipe-max-size), so one
    output frame (up to 256 KiB) goes out in one write, not four waits on a
    64 KiB pipe. Best effort; anything but a pipe is left alone."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass


async def _upload(session: ShellSession, stdin: StdinSource) -> None:
    """Stdin to the agent, a chunk at a time; its end ends the remote input.

    The agent closing the channel ends this quietly: the process may have
    exited before reading its input (its EXIT is on the way), and if the
    session broke, the reading side reports it.
    """
    with _agent_may_be_gone():
        while True:
            try:
                data = await stdin.receive_some()
            except (trio.BrokenResourceError, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno not in (errno.EIO, errno.EBADF):
                    raise
                data = b""
            if not data:
                await session.close_stdin()
                return
            await session.send_stdin(data)


@contextlib.contextmanager
def _agent_may_be_gone() -> Iterator[None]:
    """Sends to a channel the agent closed end without an error (see _upload)."""
    try:
        yield
    except (MuxError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _signals(session: ShellSession, raw: bool) -> None:
    """SIGWINCH becomes RESIZE; SIGINT goes to the remote process group (a raw
    terminal sends ^C as a byte instead); SIGTERM and SIGHUP hang up."""
    caught = (signal.SIGWINCH, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    with trio.open_signal_receiver(*caught) as signals, _agent_may_be_gone():
        async for signum in signals:
            if signum == signal.SIGWINCH:
                if raw:
                    await session.resize(*_window_size(0))
            elif signum == signal.SIGINT:
                await session.signal("INT")
            else:
                await session.signal("HUP")

