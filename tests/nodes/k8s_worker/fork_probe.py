"""A stand-in agent the fork server's tests fork: ``-m tests.nodes.k8s_worker.fork_probe
--config FILE``. Importing it does nothing (the fork server preloads it).

Run, it reads its config (so its memory holds its report token), prints one
JSON line of what it is (``probe=`` then the object: ids, groups, umask,
session, working folder, environment, and whether it could read the file
``PROBE_READ`` names), then behaves as ``FAKE_AGENT`` says: ``sleep`` (until
SIGTERM, exit 0) or ``fail`` (exit 3). Its descriptors and command line the
tests read in ``/proc`` themselves (some hosts let no user but root in).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def _report() -> dict:
    config_path = sys.argv[sys.argv.index("--config") + 1]
    with open(config_path) as file:
        config = json.load(file)
    umask = os.umask(0)
    os.umask(umask)
    readable = None
    if os.environ.get("PROBE_READ"):
        try:
            with open(os.environ["PROBE_READ"]) as file:
                readable = "report_token" in file.read()
        except OSError:
            readable = False
    return {"resuid": os.getresuid(), "resgid": os.getresgid(), "groups": os.getgroups(),
            "umask": umask, "pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
            "cwd": os.getcwd(), "env": dict(os.environ), "read_other": readable,
            "token_len": len(config["report_token"])}


def main(argv: list[str] | None = None) -> None:
    """Called by the fork server with the arguments (``sys.argv`` has them too)."""
    report = _report()
    print("probe=" + json.dumps(report), flush=True)
    if os.environ.get("FAKE_AGENT") == "fail":
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(60)


if __name__ == "__main__":
    main()
