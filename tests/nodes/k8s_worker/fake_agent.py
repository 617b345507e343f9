"""A stand-in agent process for the local backend's tests: ``fake_agent.py --config FILE``.

It keeps a file in its storage folder across restarts (``first-boot``, written
once), prints its generation, and behaves as ``FAKE_AGENT`` says: ``sleep``
(until SIGTERM, then exit 0), ``stubborn`` (ignores SIGTERM), ``fail`` (exit
3 at once), ``exit0`` (exit 0 at once). It never runs longer than 60 s.
"""

import json
import os
import secrets
import signal
import sys
import time

config_path = sys.argv[sys.argv.index("--config") + 1]
with open(config_path) as file:
    config = json.load(file)
marker = os.path.join(config["storage"], "first-boot")
if not os.path.exists(marker):
    with open(marker, "w") as file:
        file.write(secrets.token_hex(8))
print(f"fake agent generation={config['generation']} pid={os.getpid()}", flush=True)
mode = os.environ.get("FAKE_AGENT", "sleep")
if mode == "fail":
    print("error: the model does not load", flush=True)
    sys.exit(3)
if mode == "exit0":
    sys.exit(0)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(60)
