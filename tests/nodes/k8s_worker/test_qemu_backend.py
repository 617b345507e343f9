"""The qemu backend: its command line, the guest's view of the platform, and the VM
lifecycle (create, restart keeping the disk, delete, a worker restart) with a
stand-in for QEMU (tests/nodes/k8s_worker/fake_qemu.py). Booting the real guest
image under KVM is `make test-vm` (tests/vm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
import trio

from nodes.k8s_worker.backend import BackendError, VmiPhase
from nodes.k8s_worker.qemu import QemuBackend, QemuSettings, VmFiles, guest_agent_config
from nodes.k8s_worker.qemu.backend import kvm_problem
from nodes.k8s_worker.qemu.launch import GuestImage, ImageError, qemu_argv, read_image
from nodes.k8s_worker.qemu.qmp import QmpError, qmp_command, reachable_path
from runtime.process import is_alive

from .units import MODEL_SETTINGS, container_unit, vllm_unit

TOOLS = ("qemu-img", "mkfs.vfat", "mcopy")
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]
if MISSING and os.environ.get("CAC_QEMU_REQUIRED"):
    raise RuntimeError(f"CAC_QEMU_REQUIRED is set but {', '.join(MISSING)} is missing "
                       "(bash .ci/run deps installs it)")
needs_tools = pytest.mark.skipif(bool(MISSING), reason=f"{MISSING} missing (bash .ci/run deps)")
LIMIT_S = 20

IMAGE = GuestImage(disk=Path("/images/guest.qcow2"), kernel=Path("/images/vmlinuz"),
                   initrd=Path("/images/initrd.img"), cmdline="root=LABEL=cosmicac-root rw")


def test_settings_refuse_what_cannot_work():
    for bad in ({"gpus": ["3b:00.0"]}, {"gpus": ["0000:3b:00.0", "0000:3b:00.0"]},
                {"gpus": ["0000:3b:00.0"], "unbacked_gpus": 2}, {"host_alias": "127.0.0.1"},
                {"host_alias": "8.8.8.8"}, {"disk_size_gib": 1}, {"network": "tap"}):
        with pytest.raises(pydantic.ValidationError):
            QemuSettings(**bad)
    settings = QemuSettings(gpus=("0000:3b:00.0", "0000:86:00.0"))
    assert settings.gpu_count == 2
    assert (settings.cpus(0), settings.memory_mib(0)) == (2, 2048)
    assert (settings.cpus(2), settings.memory_mib(2)) == (8, 16384)


def test_the_guest_reaches_the_hosts_loopback_through_the_alias_and_nothing_else_moves():
    agent = vllm_unit().vmis[0].agent.model_copy(update={
        "worker_addresses": (("127.0.0.1", 49750), ("192.0.2.7", 49750)),
        "bootstrap": (("127.0.0.1", 49738), ("::1", 49738), ("192.0.2.8", 49738)),
        "relay_addresses": {"12" * 32: (("127.0.0.1", 49737),)}})
    guest = guest_agent_config(agent, QemuSettings())
    assert guest.worker_addresses == (("10.0.2.2", 49750), ("192.0.2.7", 49750))
    # A DHT on the host's loopback hands out loopback addresses: no use in the guest.
    assert guest.bootstrap == (("192.0.2.8", 49738),)
    assert guest.relay_addresses == {"12" * 32: (("10.0.2.2", 49737),)}
    assert guest.model_copy(update={"worker_addresses": agent.worker_addresses,
                                    "bootstrap": agent.bootstrap,
                                    "relay_addresses": agent.relay_addresses}) == agent


def test_the_command_line_boots_the_overlay_with_its_seed_and_passes_gpus():
    vmi = container_unit(node="qemu-node-1", gpus=2).vmis[0]
    files = VmFiles(Path("/state") / vmi.disk)
    settings = QemuSettings(gpus=("0000:3b:00.0", "0000:86:00.0"))
    argv = qemu_argv(vmi, settings, files, IMAGE, accel="kvm", gpus=settings.gpus)
    line = " ".join(argv)
    assert argv[0] == "qemu-system-x86_64"
    assert "-machine q35,accel=kvm -cpu host -smp 8 -m 16384M" in line
    assert f"file={files.disk},format=qcow2" in line
    assert f"file={files.seed},format=raw,readonly=on" in line
    assert f"-kernel {IMAGE.kernel} -initrd {IMAGE.initrd}" in line
    assert argv[argv.index("-append") + 1] == IMAGE.cmdline
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-device"
            and argv[i + 1].startswith("vfio")] == ["vfio-pci,host=0000:3b:00.0",
                                                   "vfio-pci,host=0000:86:00.0"]
    firmware = qemu_argv(vmi, QemuSettings(kernel_boot=False), files, IMAGE, accel="tcg")
    assert "-kernel" not in firmware and "-cpu" in firmware
    assert firmware[firmware.index("-cpu") + 1] == "max"
    assert any(a.startswith("if=pflash") for a in firmware)
    assert not any(a.startswith("vfio") for a in firmware)


def test_an_image_without_its_manifest_says_to_build_it():
    with pytest.raises(ImageError, match="make image"):
        read_image(Path("/images/guest.qcow2"), "{not json")
    with pytest.raises(ImageError, match="command line"):
        read_image(Path("/images/guest.qcow2"), '{"cmdline": ""}')
    assert read_image(Path("/i/g.qcow2"), '{"cmdline": "root=x"}').kernel == Path("/i/vmlinuz")


def test_kvm_is_refused_where_only_the_nested_page_table_flavour_is_loaded(tmp_path):
    device = tmp_path / "kvm"
    device.write_bytes(b"")
    modules = tmp_path / "module"
    (modules / "kvm_pvm").mkdir(parents=True)
    assert "only kvm_pvm" in kvm_problem(modules, device)
    (modules / "kvm_intel").mkdir()
    assert kvm_problem(modules, device) is None
    assert "No such file" in kvm_problem(modules, tmp_path / "absent")


async def _qmp_server(path: Path, replies: list[bytes], task_status) -> None:
    with trio.socket.socket(trio.socket.AF_UNIX) as server:
        await server.bind(str(path))
        server.listen(1)
        task_status.started()
        conn, _ = await server.accept()
        with conn:
            await conn.send(b'{"QMP": {"version": {}}}\n')
            for reply in replies:
                await conn.recv(65536)
                await conn.send(reply)
            await trio.sleep_forever()


@pytest.mark.parametrize("replies, outcome", [
    ([b'{"return": {}}\n', b'{"event": "POWERDOWN"}\n{"return": {"status": "ok"}}\n'],
     {"status": "ok"}),
    ([b'{"return": {}}\n', b'{"error": {"class": "GenericError", "desc": "no"}}\n'],
     "GenericError: no"),
    ([b'{"return": {}}\n', b"[1, 2]\n"], "no object"),
    ([b'{"return": {}}\n', b"garbage\n"], "no JSON"),
    ([b'{"return": {}}\n'], "did not answer"),
])
async def test_qmp_returns_the_answer_skips_events_and_names_every_failure(
        tmp_path, nursery, autojump_clock, replies, outcome):
    path = tmp_path / "qmp.sock"
    await nursery.start(_qmp_server, path, replies)
    if isinstance(outcome, dict):
        assert await qmp_command(path, "query-status") == outcome
    else:
        with pytest.raises(QmpError, match=outcome):
            await qmp_command(path, "query-status")


async def test_qmp_reaches_a_socket_whose_path_is_longer_than_a_socket_address(
        tmp_path, nursery):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    socket = deep / "qmp.sock"
    assert len(str(socket)) > 108
    with reachable_path(socket) as short:
        await nursery.start(_qmp_server, Path(short), [b'{"return": {}}\n', b'{"return": 7}\n'])
    assert await qmp_command(socket, "query-status") == 7


async def test_qmp_on_a_socket_nobody_serves_is_a_qmp_error(tmp_path):
    with pytest.raises(QmpError, match="QMP socket"):
        await qmp_command(tmp_path / "absent.sock", "system_powerdown")


# -- the lifecycle, with a stand-in for QEMU ------------------------------------------


@pytest.fixture
def fake_image(tmp_path: Path) -> Path:
    folder = tmp_path / "image"
    folder.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(folder / "guest.qcow2"),
                    "64M"], check=True)
    for name in ("vmlinuz", "initrd.img"):
        (folder / name).write_bytes(b"\0")
    (folder / "image.json").write_text(json.dumps({"key": "abc123", "cmdline": "root=x"}))
    return folder / "guest.qcow2"


def _fake_qemu(tmp_path: Path) -> str:
    script = tmp_path / "qemu-system-x86_64"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} "
                      f"{Path(__file__).with_name('fake_qemu.py')} \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def _settings(tmp_path: Path, image: Path, **more) -> QemuSettings:
    return QemuSettings(image=image, qemu=_fake_qemu(tmp_path), node="gpu-node-1",
                        unbacked_gpus=8, accel="tcg", stop_grace_s=5, **more)


async def _next(events: trio.MemoryReceiveChannel, name: str, phase: VmiPhase):
    with trio.fail_after(LIMIT_S):
        async for event in events:
            if event.name == name and event.phase == phase:
                return event
    raise AssertionError("events ended")


def _user_data(files: VmFiles) -> str:
    return subprocess.run(["mcopy", "-i", str(files.seed), "::/user-data", "-"],
                          check=True, capture_output=True, text=True).stdout


def _backing(disk: Path) -> str:
    info = subprocess.run(["qemu-img", "info", "-U", "--output=json", str(disk)],
                          check=True, capture_output=True)
    return json.loads(info.stdout)["backing-filename"]


@needs_tools
async def test_create_restart_keeps_the_disk_delete_removes_it(tmp_path, nursery, fake_image):
    backend = QemuBackend(_settings(tmp_path, fake_image), tmp_path / "vms")
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    unit = container_unit()
    vmi = unit.vmis[0]
    files = backend.files(vmi)
    await backend.create(unit)
    booting = await _next(events, vmi.name, VmiPhase.BOOTING)
    assert "tcg, 4 vCPU, 8192 MiB" in booting.message
    assert (await _next(events, vmi.name, VmiPhase.RUNNING)).message == "VM kernel started"
    # The overlay is backed by a frozen copy of the image, not the image itself.
    assert Path(_backing(files.disk)).parent == tmp_path / "vms" / "images"
    argv = json.loads((files.folder / "argv.json").read_text())
    assert argv[argv.index("-append") + 1] == "root=x"
    seed = await trio.to_thread.run_sync(_user_data, files)
    assert seed.startswith("#cloud-config") and "cosmicac-agent" in seed
    assert oct(files.seed.stat().st_mode & 0o777) == "0o600"
    first_pid = backend.pid(vmi.name)

    files.disk.with_suffix(".marker").write_text("kept")
    inode = files.disk.stat().st_ino
    await backend.restart(container_unit(generation=1))
    assert (await _next(events, vmi.name, VmiPhase.GONE)).message.endswith("(disk kept)")
    await _next(events, vmi.name, VmiPhase.BOOTING)
    assert backend.pid(vmi.name) != first_pid
    assert files.disk.stat().st_ino == inode  # the same disk, booted again
    assert '\\"generation\\": 1' in await trio.to_thread.run_sync(_user_data, files)

    await backend.delete(unit)
    assert (await _next(events, vmi.name, VmiPhase.GONE)).message == \
        "VM powered off, disk removed"
    assert not files.folder.exists()
    assert list((tmp_path / "vms" / "images").iterdir()) == []  # nobody uses it now
    await backend.delete(unit)  # gone is fine


@needs_tools
async def test_a_worker_restart_finds_its_vms_and_leaves_them_running(
        tmp_path, nursery, fake_image):
    settings = _settings(tmp_path, fake_image)
    first = QemuBackend(settings, tmp_path / "vms")
    send, events = trio.open_memory_channel(100)
    async with trio.open_nursery() as inner:
        await inner.start(first.run, send)
        await first.create(container_unit())
        await _next(events, container_unit().vmis[0].name, VmiPhase.BOOTING)
        pid = first.pid(container_unit().vmis[0].name)
        inner.cancel_scope.cancel()  # the worker stops; the VM does not
    assert pid is not None and is_alive(pid, None)

    second = QemuBackend(settings, tmp_path / "vms")
    second.adopt([container_unit()])
    await nursery.start(second.run, send)
    adopted = await _next(events, container_unit().vmis[0].name, VmiPhase.RUNNING)
    assert adopted.message == f"VM (QEMU {pid}) adopted"
    assert await second.stop_all() == 1
    with trio.fail_after(LIMIT_S):
        while is_alive(pid, None):  # noqa: ASYNC110 - not our child: nothing to wait on
            await trio.sleep(0.05)


@needs_tools
async def test_a_guest_that_ignores_the_power_button_is_killed_after_the_grace(
        tmp_path, nursery, fake_image, monkeypatch):
    monkeypatch.setenv("FAKE_QEMU_POWERDOWN_S", "never")
    backend = QemuBackend(_settings(tmp_path, fake_image).model_copy(
        update={"stop_grace_s": 0.5}), tmp_path / "vms")
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    await backend.create(container_unit())
    await _next(events, container_unit().vmis[0].name, VmiPhase.BOOTING)
    with trio.fail_after(LIMIT_S):
        await backend.delete(container_unit())
    assert backend.pid(container_unit().vmis[0].name) is None


@needs_tools
async def test_a_vmi_placed_elsewhere_or_too_big_and_a_missing_image_are_refused(
        tmp_path, nursery, fake_image):
    backend = QemuBackend(_settings(tmp_path, fake_image), tmp_path / "vms")
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    with pytest.raises(BackendError, match="this host is 'gpu-node-1'"):
        await backend.create(container_unit(node="gpu-node-9"))
    with pytest.raises(BackendError, match="9 GPUs asked, this host has 8"):
        await backend.create(container_unit(gpus=9))
    missing = QemuBackend(_settings(tmp_path, tmp_path / "none.qcow2"), tmp_path / "vms2")
    await nursery.start(missing.run, send)
    with pytest.raises(BackendError, match="make image"):
        await missing.create(container_unit())
    failed = await _next(events, container_unit().vmis[0].name, VmiPhase.FAILED)
    assert "make image" in failed.message


@needs_tools
async def test_a_models_hub_token_rides_on_a_disk_of_its_own_named_by_its_serial(
        tmp_path, nursery, fake_image, caplog):
    secrets_dir = tmp_path / "secrets"
    (secrets_dir / "hf-token").mkdir(parents=True)
    (secrets_dir / "hf-token" / "token").write_text("hf_first\n")
    backend = QemuBackend(_settings(tmp_path, fake_image), tmp_path / "vms",
                          secrets_dir=secrets_dir)
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    unit = vllm_unit(nodes=("gpu-node-1",), model_settings=MODEL_SETTINGS)
    vmi = unit.vmis[0]
    files = backend.files(vmi)
    await backend.create(unit)
    await _next(events, vmi.name, VmiPhase.RUNNING)
    argv = json.loads((files.folder / "argv.json").read_text())
    assert f"if=none,id=hubtoken,file={files.hub_token},format=raw,readonly=on" in argv
    assert "virtio-blk-pci,drive=hubtoken,serial=cac-hub-token" in argv
    token = (await trio.run_process(["mcopy", "-i", str(files.hub_token), "::/token", "-"],
                                    capture_stdout=True)).stdout.decode()
    assert token == "hf_first\n"
    assert oct(files.hub_token.stat().st_mode & 0o777) == "0o600"
    seed = await trio.to_thread.run_sync(_user_data, files)
    assert "hf_first" not in seed  # the token is on its disk, never in the user data
    assert "/run/cosmicac/hub-token/token" in seed and "virtio-cac-hub-token" in seed
    # The Secret removed: the next start has no token disk (the agent says what it lacks).
    (secrets_dir / "hf-token" / "token").unlink()
    await backend.restart(vllm_unit(nodes=("gpu-node-1",), model_settings=MODEL_SETTINGS,
                                    generation=1))
    await _next(events, vmi.name, VmiPhase.GONE)
    await _next(events, vmi.name, VmiPhase.RUNNING)  # the new VM wrote its argv.json
    assert not files.hub_token.exists()
    assert "hubtoken" not in " ".join(json.loads((files.folder / "argv.json").read_text()))
    assert "qemu.hub_token_missing" in caplog.text
    await backend.delete(unit)


@needs_tools
async def test_console_lines_of_a_failing_guest_reach_the_system_log_once_each(
        tmp_path, nursery, fake_image, monkeypatch):
    failing = ["[FAILED] Failed to start cosmicac-agent.service.",
               "cosmicac: cannot mount /dev/disk/by-id/virtio-cac-hub-token on /run/x",
               "[FAILED] Failed to start cosmicac-agent.service.",  # a repeat: said once
               "[  OK  ] Reached target multi-user.target."]         # not a failure
    monkeypatch.setenv("FAKE_QEMU_CONSOLE", json.dumps(failing))
    poll_s = 0.1  # the console read every 0.1 s rather than 0.5 s
    monkeypatch.setattr("nodes.k8s_worker.qemu.backend.CONSOLE_POLL_S", poll_s)
    backend = QemuBackend(_settings(tmp_path, fake_image), tmp_path / "vms")
    send, events = trio.open_memory_channel(100)
    await nursery.start(backend.run, send)
    unit = container_unit()
    vmi = unit.vmis[0]
    await backend.create(unit)
    await _next(events, vmi.name, VmiPhase.RUNNING)
    said = []
    with trio.move_on_after(LIMIT_S):
        async for event in events:
            if event.message.startswith("VM console: "):
                said.append(event.message.removeprefix("VM console: "))
                assert event.phase is VmiPhase.RUNNING  # a line, not a change of phase
            if len(said) == 2:
                break
    assert said == failing[:2]
    with trio.move_on_after(3 * poll_s):  # a few polls: nothing more
        extra = await events.receive()
        assert not extra.message.startswith("VM console"), extra
    await backend.delete(unit)
