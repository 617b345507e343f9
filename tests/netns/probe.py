"""Tiny TCP/UDP servers and clients to run inside the namespaces (stdlib only).

``python probe.py COMMAND ...``; every command is bounded in time and count, and prints
JSON lines on stdout (servers print ``READY`` first, once their socket is bound):

* ``tcp-serve --host H --port P [--accept N] [--timeout S]`` accepts up to N connections
  within S seconds; from each it reads until EOF and answers ``echo:`` + what it read.
  One line per connection ``{"event": "accepted", "peer": [ip, port], "data": ...}``,
  then ``{"event": "done", "accepted": n}``.
* ``tcp-connect --host H --port P --send TEXT [--timeout S]`` connects, sends, half-closes
  and reads the reply: ``{"result": "ok"|"timeout"|"refused"|"unreachable"|"error",
  "reply": ..., "seconds": ...}``.
* ``udp-serve --host H --port P [--count N] [--timeout S] [--echo] [--stray-port Q]
  [--stop TEXT]`` receives up to N datagrams within S seconds (or until one equals TEXT),
  one ``{"event": "datagram", ...}`` line each; with ``--echo`` it answers ``echo:`` + data
  from its own port, and with ``--stray-port`` it first sends ``stray:`` + data from
  another socket bound to port Q (not a reply, as far as a firewall can tell).
* ``udp-send --host H --port P --send TEXT [--count N] [--wait S] [--until TEXT]`` sends
  the datagram N times, then collects replies for up to S seconds (stopping early at one
  that starts with the --until text): ``{"sent": n, "replies": [{"peer": ..., "data": ...}]}``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()
MAX_READ = 65536


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def tcp_serve(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.timeout
    with socket.create_server((args.host, args.port), reuse_port=False) as server:
        print("READY", flush=True)
        accepted, limit = 0, min(args.accept, 1000)
        while accepted < limit and (remaining := deadline - time.monotonic()) > 0:
            server.settimeout(remaining)
            try:
                conn, peer = server.accept()
            except TimeoutError:
                break
            accepted += 1
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                data = b""
                try:
                    while len(data) < MAX_READ and (chunk := conn.recv(MAX_READ)):
                        data += chunk
                    conn.sendall(b"echo:" + data)
                except OSError:
                    pass
            _say(event="accepted", peer=list(peer), data=data.decode(errors="replace"))
        _say(event="done", accepted=accepted)


def tcp_connect(args: argparse.Namespace) -> None:
    started = time.monotonic()
    result, reply = "ok", ""
    try:
        with socket.create_connection((args.host, args.port), timeout=args.timeout) as conn:
            conn.sendall(args.send.encode())
            conn.shutdown(socket.SHUT_WR)
            data = b""
            while len(data) < MAX_READ and (chunk := conn.recv(MAX_READ)):
                data += chunk
            reply = data.decode(errors="replace")
    except TimeoutError:
        result = "timeout"
    except ConnectionRefusedError:
        result = "refused"
    except OSError as exc:
        result = "unreachable" if exc.errno in (101, 113) else "error"
        reply = str(exc)
    _say(result=result, reply=reply, seconds=round(time.monotonic() - started, 3))


def udp_serve(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.timeout
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((args.host, args.port))
        stray = None
        if args.stray_port is not None:
            stray = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            stray.bind((args.host, args.stray_port))
        print("READY", flush=True)
        received, limit = 0, min(args.count, 1000)
        try:
            while received < limit and (remaining := deadline - time.monotonic()) > 0:
                sock.settimeout(remaining)
                try:
                    data, peer = sock.recvfrom(MAX_READ)
                except TimeoutError:
                    break
                received += 1
                text = data.decode(errors="replace")
                _say(event="datagram", peer=list(peer), data=text)
                if args.stop is not None and text == args.stop:
                    break
                if stray is not None:
                    stray.sendto(b"stray:" + data, peer)
                if args.echo:
                    sock.sendto(b"echo:" + data, peer)
        finally:
            if stray is not None:
                stray.close()
        _say(event="done", received=received)


def udp_send(args: argparse.Namespace) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(min(args.count, 1000)):
            sock.sendto(args.send.encode(), (args.host, args.port))
        replies = []
        deadline = time.monotonic() + args.wait
        while len(replies) < 100 and (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            try:
                data, peer = sock.recvfrom(MAX_READ)
            except TimeoutError:
                break
            except OSError as exc:  # e.g. ECONNREFUSED from an ICMP error
                replies.append({"peer": None, "data": None, "error": str(exc)})
                break
            text = data.decode(errors="replace")
            replies.append({"peer": list(peer), "data": text})
            if args.until is not None and text.startswith(args.until):
                break
        _say(sent=args.count, replies=replies)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bounded TCP/UDP probes")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func: object, timeout: float) -> argparse.ArgumentParser:
        sub = commands.add_parser(name)
        sub.set_defaults(func=func)
        sub.add_argument("--host", required=True)
        sub.add_argument("--port", type=int, required=True)
        sub.add_argument("--timeout", type=float, default=timeout)
        return sub

    sub = command("tcp-serve", tcp_serve, 5.0)
    sub.add_argument("--accept", type=int, default=1)
    sub = command("tcp-connect", tcp_connect, 1.0)
    sub.add_argument("--send", default="")
    sub = command("udp-serve", udp_serve, 5.0)
    sub.add_argument("--count", type=int, default=1)
    sub.add_argument("--echo", action="store_true")
    sub.add_argument("--stray-port", type=int)
    sub.add_argument("--stop")
    sub = command("udp-send", udp_send, 1.0)
    sub.add_argument("--send", required=True)
    sub.add_argument("--count", type=int, default=1)
    sub.add_argument("--wait", type=float, default=0.0)
    sub.add_argument("--until")

    args = parser.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
