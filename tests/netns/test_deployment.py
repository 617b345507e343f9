"""The multi-host deployment of deploy/README.md on namespaces (tests/netns/deploy_lab.py):
`cosmicac bootstrap` writes the configs, each daemon runs as `cosmicac run SERVICE` on
its host, the GPU host takes no inbound connection, the job VMs (the local backend's
agents, in a namespace of their own) sit on a network that reaches only the relay box,
as on a blocked cluster network, and a user's workstation that
reaches only the entry point and the relay box signs up, runs an inference job and
chats with it through the `openai` package, opens a shell on a container job (paired
through the relay by its address: the desk reaches no DHT), reads its logs and deletes
the jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns.capture import Capture
from tests.netns.deploy_lab import ADDRESSES, DeployLab
from tests.netns.test_relay_scenario import COSMICAC, wait_for_ready

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SERVER = f"http://{ADDRESSES['control']}:5173"
#: Printed by a shell on a job: must never cross the relay box in the clear.
MARKER = "SHELL-PLAINTEXT-5d1c"
EMAIL, PASSWORD = "ada@example.com", "a long enough password, really"
#: (host, service, ready line's daemon name) in start order.
DAEMONS = (("control", "dht", "dht-bootstrap"), ("relay", "relay", "relay"),
           ("control", "wrk-monitor", "wrk-monitor"), ("control", "app-node", "app-node"),
           ("control", "wrk-ork", "wrk-ork"), ("gpu", "wrk-server-k8s-nvidia",
                                               "wrk-server-k8s-nvidia"),
           ("control", "proxy-inference", "proxy-inference"), ("control", "ui", "ui"),
           ("control", "entry", "entry"))


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value.strip("'\"")
    return values


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, netns_available: None
             ) -> Iterator[tuple[DeployLab, Path, dict[str, str]]]:
    # netns_available: without root, ip or iptables this skips (fails in CI) like
    # every other namespace test, instead of erroring in the lab's build.
    folder = tmp_path_factory.mktemp("deployment")
    deployment = folder / "cosmicac"
    base = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    done = subprocess.run([COSMICAC, "bootstrap", "--dir", str(deployment),
                           "--default-host", ADDRESSES["control"],
                           "--host", f"relay={ADDRESSES['relay']}",
                           "--host", f"wrk-server-k8s-nvidia={ADDRESSES['gpu']}",
                           "--backend", "local"], capture_output=True, text=True,
                          env=base, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    with DeployLab.create() as lab:
        # The job VMs live on a network of their own that reaches only the relay box.
        worker_config = deployment / "config" / "wrk-server-k8s-nvidia.json"
        settings = json.loads(worker_config.read_text())
        settings["local"]["agent_netns"] = lab.namespaces["agents"]
        worker_config.write_text(json.dumps(settings, indent=2))
        for host, service, daemon in DAEMONS:
            argv = [COSMICAC, "run", service]
            if service != "dht":
                argv += ["--config", str(deployment / "config" / f"{service}.json")]
            env = {**base, **_env_file(deployment / "env" / f"{service}.env")}
            out = folder / f"{service}.out"
            lab.popen(host, argv, env=env, stdout=out.open("wb"),
                      stderr=(folder / f"{service}.err").open("wb"))
            try:
                wait_for_ready(out, daemon, timeout=60)
            except TimeoutError:
                raise AssertionError((folder / f"{service}.err").read_text()[-3000:]) from None
        connected = lab.run("control", [COSMICAC, "autobase-connect", "--dir", str(deployment)],
                            capture_output=True, text=True, env=base, timeout=60)
        assert connected.returncode == 0, connected.stderr
        desk = {**base, "COSMICAC_CONFIG_DIR": str(folder / "desk-config"),
                "COSMICAC_SERVER": SERVER}
        yield lab, folder, desk


def _desk(lab: DeployLab, env: dict[str, str], *args: str, stdin: str | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return lab.run("desk", [COSMICAC, *args], input=stdin, capture_output=True, text=True,
                   env=env, timeout=timeout)


def test_a_workstation_that_reaches_only_the_door_and_the_relay_uses_the_platform(
        deployed, tmp_path):
    lab, _, env = deployed
    signup = lab.run("desk", [sys.executable, "-c", (
        "import json, sys, urllib.request\n"
        f"body = json.dumps({{'email': '{EMAIL}', 'name': 'Ada', 'team_name': 'core', "
        f"'password': '{PASSWORD}'}}).encode()\n"
        f"request = urllib.request.Request('{SERVER}/api/auth/signup', data=body, "
        "headers={'content-type': 'application/json'})\n"
        "print(urllib.request.urlopen(request, timeout=30).status)\n")],
        capture_output=True, text=True, timeout=60)
    assert signup.stdout.strip() == "201", signup.stderr
    login = _desk(lab, env, "login", "--email", EMAIL, "--password-stdin",
                  stdin=PASSWORD + "\n")
    assert login.returncode == 0, login.stderr

    # A container job for the shell below, created beside the inference job (two users'
    # jobs starting at once, and the agents' start-ups overlap instead of adding up).
    box_create = lab.popen("desk", [COSMICAC, "jobs", "create", "--name", "box", "--type",
                                    "container", "--gpus", "1", "--wait", "--timeout", "120"],
                           env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    # Managed inference: created, Active, answered through the entry point by `openai`.
    model = _desk(lab, env, "jobs", "create", "--name", "chat", "--type", "inference",
                  "--runtime", "local", "--model", "demo", "--gpus", "1", "--wait",
                  "--timeout", "120", timeout=180)
    assert model.returncode == 0, model.stderr
    job = model.stdout.strip()
    key = json.loads(_desk(lab, env, "apikeys", "create", "--name", "desk", "-o", "json"
                           ).stdout)["key"]
    answer = lab.run("desk", [sys.executable, "-c", (
        "import openai\n"
        f"client = openai.OpenAI(base_url='{SERVER}/inference/v1', api_key='{key}')\n"
        "reply = client.chat.completions.create(model='demo', "
        "messages=[{'role': 'user', 'content': 'hello'}], max_tokens=8)\n"
        "print(reply.usage.total_tokens, reply.choices[0].message.content is not None)\n")],
        capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr
    tokens, has_text = answer.stdout.split()
    assert int(tokens) > 0 and has_text == "True"

    # A shell on a container job: the agent sits on the firewalled GPU host and the desk
    # reaches no DHT: paired through the relay, known by the address app-node gives.
    box_out, box_err = box_create.communicate(timeout=180)
    assert box_create.returncode == 0, box_err
    box_job = box_out.strip()
    # The relay box sees the shell's bytes go by, never what they say.
    with Capture(lab, "relay", tmp_path / "relay.cap", max_bytes=64 << 20) as capture:
        shell = _desk(lab, env, "shell", box_job, "--", "sh", "-c",
                      f"echo {MARKER}-$((6*7)); exit 5", timeout=60)
        seen = capture.stop()
    assert shell.stdout == f"{MARKER}-42\n", shell.stderr
    assert shell.returncode == 5
    assert seen.summary["packets"] > 0
    assert not seen.contains(MARKER.encode()), "the relay box saw the shell's plaintext"

    logs = _desk(lab, env, "jobs", "logs", job)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
    # Both deletes at once, each waiting until its job is gone.
    deleting = [lab.popen("desk", [COSMICAC, "jobs", "delete", name, "--wait", "--timeout",
                                   "60"], env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for name in (job, box_job)]
    for deleted in deleting:
        _, stderr = deleted.communicate(timeout=120)
        assert deleted.returncode == 0, stderr
    # The desk could not have gone around: it tried other destinations (the DHT, the
    # agent's own address) and its firewall dropped them.
    counters = lab.run_in("desk", ["iptables", "-L", "OUTPUT", "-v", "-n", "-x"])
    dropped = next(line for line in counters.splitlines() if "desk-blocked" in line)
    assert int(dropped.split()[0]) > 0, counters
