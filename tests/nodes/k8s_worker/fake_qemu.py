"""A stand-in for qemu-system-x86_64 in the qemu backend's tests (no VM boots).

Reads the options the backend passes (-pidfile, -serial file:, -qmp unix:),
writes a pid file and a console line the way a booting guest would, then
serves QMP: ``system_powerdown`` ends it with status 0 after
``FAKE_QEMU_POWERDOWN_S`` (unset: at once; ``never``: the guest ignores the
button). It records its argv in ``<folder>/argv.json`` for the tests to read;
``FAKE_QEMU_CONSOLE`` (a JSON list) adds lines to the console after the first.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def main() -> None:
    argv = sys.argv
    console = _option(argv, "-serial").removeprefix("file:")
    qmp = _option(argv, "-qmp").removeprefix("unix:").split(",")[0]
    folder = os.path.dirname(os.path.abspath(qmp))  # QEMU runs in the VM's folder
    with open(os.path.join(folder, "argv.json"), "w") as out:
        json.dump(argv, out)
    with open(_option(argv, "-pidfile"), "w") as out:
        out.write(f"{os.getpid()}\n")
    with open(console, "a") as out:
        out.write("[    0.000000] Linux version 6.1.0-fake\n")
        # Lines a failing guest would print after boot (a JSON list).
        for line in json.loads(os.environ.get("FAKE_QEMU_CONSOLE", "[]")):
            out.write(line + "\n")
    server = socket.socket(socket.AF_UNIX)
    server.bind(qmp)
    server.listen(4)
    delay = os.environ.get("FAKE_QEMU_POWERDOWN_S", "0")
    while True:
        conn, _ = server.accept()
        with conn, conn.makefile("rwb") as stream:
            stream.write(b'{"QMP": {"version": {}, "capabilities": []}}\n')
            stream.flush()
            for line in stream:
                command = json.loads(line)["execute"]
                stream.write(b'{"return": {}}\n')
                stream.flush()
                if command == "system_powerdown" and delay != "never":
                    time.sleep(float(delay))
                    sys.exit(0)


if __name__ == "__main__":
    main()
