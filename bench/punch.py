"""Hole punching: success and time to the direct path per NAT pair, and the
punched path's throughput against a plain direct connection.

Two parts, JSON lines on stdout:

1. The NAT lab (tests/netns/nat_lab.py: Linux NAT routers in network namespaces;
   needs root and iproute2/iptables, else this part prints ``skipped``):
   ``--trials`` `cosmicac beam` trials per pair of hosts, each a listener
   reserved on the lab's relay and a dialer that reaches it through the relay
   and then punches (tests/netns/punch_trial.py), each side beaming
   ``--trial-kib`` KiB (1,024) over ``--trial-seconds`` (1.5 s). Per pair:
   ``direct_rate`` (fraction of trials that moved to a direct path),
   ``time_to_direct_p50`` / ``_p95`` / ``_max`` (s, from the relayed
   connection's start), ``intact_rate`` (both streams whole), with the
   outcomes counted.
2. On 127.0.0.1, in this process: ``--mib`` MiB one way over a connection that
   started on a relay and was punched, over a plain direct connection, and
   over a relayed one (``punched_throughput`` carries ``ratio_to_direct``).

Targets (issue 24): endpoint-independent NATs on both sides direct in 100 %
within 2 s; endpoint-independent ↔ endpoint-dependent direct in >= 90 % within
15 s (needs a UDP punch: TCP cannot predict a random port, so today these stay
relayed and say so); both endpoint-dependent: 100 % relayed and intact; after
an upgrade >= 0.9 of a direct connection's throughput.

usage: python bench/punch.py [--trials 20] [--mib 256] [--reps 3] [--skip-lab]
                             [--pair eim/open ...] [--trial-kib 1024] [--trial-seconds 1.5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections import Counter
from pathlib import Path

import trio
from _common import emit, machine, percentile, receive_and_ack, send_and_time

#: (listener, dialer, label): the lab's hosts (nat_lab.KIND says what each is).
PAIRS = (
    ("c", "a", "eim/eim-answers"),
    ("a", "c", "eim-answers/eim"),
    ("a", "open", "eim/open"),
    ("b", "open", "edm/open"),
    ("b", "a", "edm/eim"),
    ("d", "b", "edm/edm"),
)
CHUNK = b"\x00" * (64 * 1024)
ACK = b"\x01"


def lab_part(trials: int, only: set[str] | None = None, *, size: int = 1 << 20,
             seconds: float = 1.5) -> None:
    from tests.netns.nat_lab import NatLab, start_services
    from tests.netns.punch_trial import run_trial
    from tests.netns.test_relay_scenario import BLIND_RELAY, COSMICAC, wait_for_ready
    from tests.netns.topology import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        emit("punch", "lab", 0, "skipped", reason=reason)
        return
    with tempfile.TemporaryDirectory(prefix="punch-bench-") as tmp, NatLab.create() as lab:
        folder = Path(tmp)
        running = start_services(lab, folder, COSMICAC, BLIND_RELAY, wait_for_ready)
        for listener, dialer, label in PAIRS:
            if only and label not in only:
                continue
            outcomes: Counter[str] = Counter()
            times: list[float] = []
            intact = 0
            for n in range(trials):
                trial = run_trial(running, listener, dialer, folder / f"{label}-{n}".replace(
                    "/", "_"), size=size, seconds=seconds)
                outcomes[trial.outcome] += 1
                intact += trial.intact
                if trial.seconds_to_direct is not None:
                    times.append(trial.seconds_to_direct)
            extra = {"pair": label, "trials": trials, "outcomes": dict(outcomes)}
            emit("punch", "direct_rate", len(times) / trials, "fraction", **extra)
            emit("punch", "intact_rate", intact / trials, "fraction", pair=label)
            if times:
                emit("punch", "time_to_direct_p50", percentile(times, 0.5), "s", pair=label)
                emit("punch", "time_to_direct_p95", percentile(times, 0.95), "s", pair=label)
                emit("punch", "time_to_direct_max", max(times), "s", pair=label)


async def _throughput(mib: int, reps: int) -> None:
    from p2p.host import ChannelService
    from p2p.keys import KeyPair
    from tests.p2p.helpers import wait_until
    from tests.p2p.swarm.helpers import swarm_net
    from tests.p2p.swarm.test_swarm_relay import closed_port

    total = mib * 1024 * 1024

    async def sink(channel):
        await receive_and_ack(channel.as_stream(), total, ACK)

    figures: dict[str, list[float]] = {"direct": [], "punched": [], "relayed": []}
    async with swarm_net(dht_nodes=3) as net:
        relay_key = KeyPair.generate()
        await net.start_relay(relay_key)
        service = [ChannelService.of_handler("sink", sink)]
        targets = {}
        for path in ("punched", "relayed"):
            targets[path] = await net.start(
                relays=(relay_key.public_key,), services=service,
                announce_addresses=(("127.0.0.1", closed_port()),),
                hole_punching=None if path == "relayed" else net.config().hole_punching)
            await wait_until(lambda t=targets[path]: relay_key.public_key in t.reserved_relays)
        targets["direct"] = await net.start(services=service)
        dialer = await net.start()
        connections = {}
        for path, target in targets.items():
            connections[path] = await dialer.connect(target.public_key)
        await wait_until(lambda: connections["punched"].path == "punched_tcp", limit_s=15)
        assert connections["relayed"].relayed and connections["direct"].path == "direct"
        for _ in range(reps):
            for path, connection in connections.items():
                channel = await connection.open_channel("sink")
                figures[path].append(await send_and_time(channel.as_stream(), total, CHUNK,
                                                         ACK))
    direct = sorted(figures["direct"])[len(figures["direct"]) // 2]
    for path in ("direct", "punched", "relayed"):
        best = sorted(figures[path])[len(figures[path]) // 2]
        extra = {"ratio_to_direct": round(best / direct, 3)} if path != "direct" else {}
        emit("punch", f"{path}_throughput", best, "MB/s", mib=mib, reps=reps, **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-lab", action="store_true")
    parser.add_argument("--pair", action="append",
                        help="only this NAT pair (as printed, e.g. eim/open; repeatable)")
    parser.add_argument("--trial-kib", type=int, default=1024,
                        help="KiB each side of a lab trial beams")
    parser.add_argument("--trial-seconds", type=float, default=1.5,
                        help="seconds over which each side of a lab trial feeds them")
    args = parser.parse_args()
    emit("punch", "machine", os.cpu_count() or 0, "cpus", **machine())
    if not args.skip_lab:
        with contextlib.suppress(KeyboardInterrupt):
            lab_part(args.trials, set(args.pair or ()), size=args.trial_kib * 1024,
                     seconds=args.trial_seconds)
    trio.run(_throughput, args.mib, args.reps)


if __name__ == "__main__":
    main()
