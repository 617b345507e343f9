"""``python -m agents.inference.runtimes.ray_wait``: the bounded waits of a multi-node vLLM start.

Two waits, each a RUN_TO_EXIT step of the vLLM plan (see _vllm.py):

- ``--reachable`` (ranks > 0): until the head's Ray port accepts a TCP
  connection, so ``ray start --address`` is only run against a head that is up.
- ``--nodes N --gpus G`` (rank 0): until ``ray status --address A`` shows at
  least N active nodes and G GPUs, so ``vllm serve`` finds every GPU it will
  place a worker on.

Exit status: 0 when the condition held in time; 1 on timeout, with what was
last seen on stderr; 2 on bad arguments.

``ray status`` prints text meant for people; :func:`parse_ray_status` reads
the two parts that have kept their shape across Ray releases: the node list
under ``Active:`` (``Healthy:`` in older releases), one ``<count> <node or
type>`` line per entry, and the ``<used>/<total> GPU`` line under
``Usage:`` (``Total Usage:`` in Ray 2). A field it cannot find is None, and a wait needing it keeps
waiting (and says so on timeout) rather than guessing.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

__all__ = [
    "ClusterView",
    "RayWaitTimeout",
    "main",
    "parse_ray_status",
    "wait_for_cluster",
    "wait_reachable",
]

#: Time between two ``ray status`` runs or two connection attempts. Ray's
#: own ``ray start`` polls the GCS about once a second; 2 s keeps the log of
#: a slow start short.
DEFAULT_INTERVAL_S = 2.0
#: Bound on one ``ray status`` run (it can hang on a GCS that accepts but does not answer).
STATUS_TIMEOUT_S = 30.0
#: Bound on one TCP connection attempt.
CONNECT_TIMEOUT_S = 5.0
#: Output kept for the timeout message.
_KEEP_CHARS = 2000

_NODE_LINE = re.compile(r"^\s+(\d+)\s+\S+")
#: ``Usage:`` in Ray 1.x, ``Total Usage:`` in Ray 2.x.
_USAGE = ("usage", "total usage")
_GPU_LINE = re.compile(r"^\s*([0-9.]+)\s*/\s*([0-9.]+)\s+GPU\s*$")


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What one ``ray status`` output says; None where it could not be read."""

    #: Active (healthy) nodes.
    nodes: int | None
    #: GPUs in the cluster, used or not.
    gpus: float | None

    def satisfies(self, nodes: int, gpus: float) -> bool:
        """At least ``nodes`` nodes and ``gpus`` GPUs (both must have been read)."""
        return (self.nodes is not None and self.nodes >= nodes
                and self.gpus is not None and self.gpus >= gpus)


def parse_ray_status(text: str) -> ClusterView:
    """Read the active node count and total GPUs from ``ray status`` output.

    Never raises: unreadable parts are None.
    """
    nodes: int | None = None
    gpus: float | None = None
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not line[:1].isspace() and stripped.endswith(":"):
            section = stripped[:-1].lower()
            if section in ("active", "healthy"):
                nodes = nodes or 0
            elif section in _USAGE and gpus is None:
                gpus = 0.0  # Ray leaves out the GPU line of a cluster without GPUs
            continue
        if section in ("active", "healthy"):
            match = _NODE_LINE.match(line)
            if match:
                nodes = (nodes or 0) + int(match.group(1))
        elif section in _USAGE:
            match = _GPU_LINE.match(line)
            if match:
                total = float(match.group(2))
                if math.isfinite(total):
                    gpus = total
    return ClusterView(nodes=nodes, gpus=gpus)


class RayWaitTimeout(Exception):
    """The condition did not hold in time; the message says what was last seen."""


#: Runs ``ray status`` once: ``(exit status, stdout + stderr)``.
StatusRunner = Callable[[], Awaitable[tuple[int, str]]]


async def wait_for_cluster(
    run_status: StatusRunner,
    *,
    nodes: int,
    gpus: float,
    timeout_s: float,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> ClusterView:
    """Run ``ray status`` until it shows ``nodes`` nodes and ``gpus`` GPUs.

    Returns:
        The view that satisfied the wait.

    Raises:
        RayWaitTimeout: not within ``timeout_s``; the message holds the last
            view and output.
    """
    last_view = ClusterView(None, None)
    last_output = "(ray status never ran)"
    with trio.move_on_after(timeout_s):
        while True:
            code, output = await run_status()
            last_output = output[-_KEEP_CHARS:]
            if code == 0:
                last_view = parse_ray_status(output)
                if last_view.satisfies(nodes, gpus):
                    return last_view
            else:
                last_output = f"(ray status exited {code})\n{last_output}"
            await trio.sleep(interval_s)
    raise RayWaitTimeout(
        f"Ray cluster not complete after {timeout_s:g}s: wanted {nodes} nodes and {gpus:g} "
        f"GPUs, last saw nodes={last_view.nodes} gpus={last_view.gpus}; last output:\n"
        f"{last_output}"
    )


Connector = Callable[[str, int], Awaitable[trio.abc.Stream]]


async def wait_reachable(
    host: str,
    port: int,
    *,
    timeout_s: float,
    interval_s: float = DEFAULT_INTERVAL_S,
    connect: Connector = trio.open_tcp_stream,
) -> None:
    """Until a TCP connection to ``host:port`` succeeds (then it is closed at once).

    Raises:
        RayWaitTimeout: not within ``timeout_s``, with the last connection error.
    """
    last_error = "no attempt finished"
    with trio.move_on_after(timeout_s):
        while True:
            with trio.move_on_after(CONNECT_TIMEOUT_S) as attempt:
                try:
                    stream = await connect(host, port)
                except OSError as exc:
                    last_error = exc.strerror or str(exc)
                else:
                    await stream.aclose()
                    return
            if attempt.cancelled_caught:
                last_error = f"connect timed out after {CONNECT_TIMEOUT_S:g}s"
            await trio.sleep(interval_s)
    raise RayWaitTimeout(
        f"Ray head {host}:{port} not reachable after {timeout_s:g}s: {last_error}"
    )


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into its parts.

    Raises:
        ValueError: not of that form.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


def _status_runner(ray: str, address: str) -> StatusRunner:
    async def run() -> tuple[int, str]:
        with trio.move_on_after(STATUS_TIMEOUT_S):
            try:
                done = await trio.run_process(
                    [ray, "status", "--address", address],
                    capture_stdout=True, capture_stderr=True, check=False,
                )
            except OSError as exc:
                return 127, f"cannot run {ray}: {exc.strerror or exc}"
            out = (done.stdout + done.stderr).decode("utf-8", "replace")
            return done.returncode, out
        return 124, f"ray status did not answer within {STATUS_TIMEOUT_S:g}s"

    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring for the exit statuses."""
    parser = argparse.ArgumentParser(
        prog="python -m agents.inference.runtimes.ray_wait",
        description="Wait, bounded, for a Ray head or a complete Ray cluster.",
    )
    parser.add_argument("--address", required=True, help="the Ray head, HOST:PORT")
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--reachable", action="store_true",
                      help="wait until the head's port accepts a connection")
    what.add_argument("--nodes", type=int, help="wait until this many nodes are active")
    parser.add_argument("--gpus", type=float, default=0.0,
                        help="with --nodes: and the cluster has this many GPUs")
    parser.add_argument("--ray", default="ray", help="the ray command")
    args = parser.parse_args(argv)
    try:
        host, port = split_address(args.address)
    except ValueError as exc:
        parser.error(str(exc))
    if args.timeout_s <= 0 or args.interval_s <= 0:
        parser.error("--timeout-s and --interval-s must be positive")

    async def run() -> str:
        if args.reachable:
            await wait_reachable(host, port, timeout_s=args.timeout_s,
                                 interval_s=args.interval_s)
            return f"ray head {args.address} reachable"
        view = await wait_for_cluster(
            _status_runner(args.ray, args.address), nodes=args.nodes, gpus=args.gpus,
            timeout_s=args.timeout_s, interval_s=args.interval_s,
        )
        return f"ray cluster {args.address} ready: nodes={view.nodes} gpus={view.gpus:g}"

    try:
        print(trio.run(run), flush=True)
    except RayWaitTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
