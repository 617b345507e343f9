"""Real VMs: ``cosmicac up --backend qemu`` boots the guest image ``make image`` built,
and a user's jobs run in it (``make test-vm``; not part of ``make test``).

One ``up`` serves the whole module, as a user runs it: a container job whose shell
is the guest's (its host name, kernel and user), a file that survives a restart
(the disk is kept) and a delete that removes the disk; an inference job on the
``local`` runtime inside a VM that answers the ``openai`` package through
proxy-inference; and ``up`` stopping with no QEMU left. KVM where the host has
hardware KVM, else software emulation (``nodes/k8s_worker/qemu``: ``kvm_problem``),
so every deadline allows for a slow guest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from ..cli.helpers import UP, free_base_port, pids_using, read_until, running_up
from ..e2e.cli import Cli

IMAGE = os.environ.get("CAC_VM_IMAGE")
pytestmark = pytest.mark.skipif(
    not IMAGE, reason="make test-vm boots the guest image (CAC_VM_IMAGE names it)")

#: A guest under software emulation boots in about a minute here; on KVM in seconds.
BOOT_S = 480


async def test_jobs_run_in_real_vms(tmp_path: Path) -> None:
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)
    assert IMAGE is not None
    storage = tmp_path / "up"
    base = free_base_port()
    env = dict(os.environ, COSMICAC_CONFIG_DIR=str(tmp_path / "config"))
    env.pop("COSMICAC_SERVER", None)
    cli = Cli(env)
    async with running_up(storage, base, env,
                          options=("--backend", "qemu", "--image", IMAGE)) as process:
        with trio.fail_after(120):
            url = (await read_until(process.stdout, UP))[1]
        env["COSMICAC_SERVER"] = url
        creds = json.loads((storage / "credentials.json").read_text())
        await cli("login", "--email", creds["email"], "--password-stdin",
                  stdin=f"{creds['password']}\n".encode())
        vms = storage / "wrk-server-k8s-nvidia" / "vms"

        # A container job: its shell is the VM's.
        box = (await cli("jobs", "create", "--name", "box", "--type", "container",
                         "--gpus", "1", "--wait", "--timeout", str(BOOT_S), process=True)
               ).stdout.decode().strip()
        vmi = "cac-" + box.removeprefix("j-") + "-r0-n0"
        shell = await cli("shell", box, "--", "sh", "-c",
                          "cat /etc/hostname; uname -sr; id -u; echo kept > /root/marker",
                          process=True)
        hostname, kernel, uid = shell.stdout.decode().split("\n")[:3]
        assert hostname == vmi
        assert kernel.startswith("Linux ") and "cloud-amd64" in kernel  # the guest's
        assert uid == "0"
        assert kernel.split()[1] != os.uname().release
        logs = (await cli("jobs", "logs", box)).stdout
        for milestone in (b"VM booting on qemu-node-1", b"VM kernel started",
                          b"VM cloud-init running"):
            assert milestone in logs, logs[-2000:]

        # A restart boots the same disk with the new generation's seed.
        disk = vms / f"{vmi}-root" / "root.qcow2"
        inode = disk.stat().st_ino
        await cli("jobs", "restart", box, "--wait", "--timeout", str(BOOT_S))
        assert disk.stat().st_ino == inode
        again = await cli("shell", box, "--", "cat", "/root/marker", process=True)
        assert again.stdout == b"kept\n"

        # An inference job inside a VM answers the openai package through the proxy.
        llm = (await cli("jobs", "create", "--name", "llm", "--type", "inference",
                         "--runtime", "local", "--model", "demo", "--gpus", "1",
                         "--wait", "--timeout", str(BOOT_S), process=True)
               ).stdout.decode().strip()

        def chat() -> openai.types.chat.ChatCompletion:
            client = openai.OpenAI(base_url=f"{url}/inference/v1", api_key=creds["api_key"],
                                   max_retries=0, timeout=60)
            return client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "Hello, VM"}],
                max_tokens=8)

        answer = await trio.to_thread.run_sync(chat)
        assert answer.choices[0].message.content and answer.usage.completion_tokens == 8

        # Deleting removes the VM and its disk.
        for job in (box, llm):
            await cli("jobs", "delete", job, "--wait", "--timeout", "120")
        assert sorted(p.name for p in vms.iterdir()) == ["images"]
        assert list((vms / "images").iterdir()) == []

        process.send_signal(2)  # Ctrl-C
        with trio.fail_after(60):
            assert await process.wait() == 0
    assert not [pid for pid in pids_using(storage)], "a process of the deployment is left"
