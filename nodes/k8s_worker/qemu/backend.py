"""The ``qemu`` backend: each VMI a KVM virtual machine on the worker's own host.

What an operator with one GPU server and no Kubernetes runs, and what
``cosmicac up --backend qemu`` runs on a machine with ``/dev/kvm``. Per VMI, a
folder under the worker's storage (:class:`~.launch.VmFiles`):

* ``root.qcow2``: a copy-on-write overlay on the guest image, kept across
  restarts and removed on delete. Its backing file is the image as it was when
  the VMI was created, kept under ``images/<key>.qcow2`` (a hard link, or a
  copy): ``make image`` may build a new image meanwhile, and an overlay over a
  changed backing file would be garbage;
* ``seed.img``: the NoCloud ``cidata`` disk with the user data the kubevirt
  backend puts in its Secret (:mod:`..cloud_init`), made anew at every start;
* ``console.log``, ``qmp.sock``, ``qemu.pid``, ``vm.json`` (pid and start time:
  a worker restarted finds its VMs again and does not stop them).

A restart powers the guest off (ACPI, then kill after ``stop_grace_s``) and
boots it again on the same disk with the new generation's seed. GPUs listed by
PCI address go to one VM each (VFIO); ``unbacked_gpus`` are placed like GPUs
and pass nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from contracts.model import NodeInfo, RackReport
from contracts.runtime_settings import HUB_TOKEN_KEY
from p2p.daemon import write_atomically
from runtime.process import describe_exit, is_alive, last_line, proc_stat, wait_gone

from ..backend import (
    BackendError,
    ReplicaUnit,
    VmiEvent,
    VmiPhase,
    VmiSpec,
    read_hub_token,
    refuse_isolated_network,
)
from .launch import GuestImage, ImageError, VmFiles, qemu_argv, read_image, seed_files
from .qmp import QmpError, qmp_command
from .settings import QemuSettings

__all__ = ["QemuBackend", "kvm_problem"]

log = logging.getLogger("nodes.k8s_worker.qemu")
#: After SIGKILL, how long a VM may take to be gone before the stop fails.
KILL_WAIT_S = 10.0
#: How often a VM's console is read for the boot's milestones.
CONSOLE_POLL_S = 0.5
#: The console lines that are worth a System line while a VM boots, by prefix
#: of what follows the kernel's timestamp (the first match of each is said once).
MILESTONES = (
    ("Linux version", "kernel started"),
    ("Run /init", "initramfs running"),
    ("systemd[1]: Detected virtualization", "systemd started"),
    ("cloud-init", "cloud-init running"),
)
#: Console lines that say the guest is failing: each becomes a System log line
#: (the console is the one place an operator sees why an agent never says hello).
FAILURE_MARKERS = ("Kernel panic", "[FAILED]", "Failed to start", "cosmicac: cannot mount",
                   "Traceback (most recent call last)", "error: ")
#: At most this many failure lines per start (a crash loop prints the same ones).
MAX_FAILURE_LINES = 20
#: How often the console is read once the boot's milestones are all seen.
CONSOLE_IDLE_POLL_S = 2.0


@dataclass
class _Vm:
    #: None: found only by its folder (stop_all), not asked for by the worker.
    spec: VmiSpec | None
    files: VmFiles
    gpus: tuple[str, ...] = ()
    pid: int | None = None
    start_ticks: int | None = None
    process: trio.Process | None = None
    exited: trio.Event = field(default_factory=trio.Event)
    stopping: bool = False
    phase: VmiPhase = VmiPhase.BOOTING
    message: str = ""

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else self.files.folder.name


class QemuBackend:
    """Runs VMIs as QEMU/KVM virtual machines on this host (see the module doc).

    Args:
        settings: the host's GPUs, the image, the VMs' size.
        state_dir: the VMIs' folders (kept across worker restarts).
        agent_executable: the agent's command inside the guest.
    """

    name = "qemu"

    def __init__(self, settings: QemuSettings, state_dir: Path, *,
                 agent_executable: str = "cosmicac", secrets_dir: Path | None = None) -> None:
        self.settings = settings
        self.state_dir = Path(state_dir)
        #: Hub token Secrets (``<name>/token``): the setting, else ``secrets_dir``,
        #: else beside ``state_dir``.
        self.secrets_dir = Path(settings.secrets_dir or secrets_dir
                                or self.state_dir.parent / "secrets")
        self.agent_executable = agent_executable
        self._vms: dict[str, _Vm] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._to_adopt: list[VmiSpec] = []
        self._events: trio.MemorySendChannel[VmiEvent] | None = None
        self._nursery: trio.Nursery | None = None
        #: ``kvm`` or ``tcg``, decided when :meth:`run` starts.
        self.accel: str | None = None

    # -- the Backend interface -------------------------------------------------------

    async def run(self, events: trio.MemorySendChannel[VmiEvent], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch the VMs; send a :class:`VmiEvent` per change. Until cancelled.

        Leaving does not stop the VMs (see :meth:`stop_all`).
        """
        self.accel = self._decide_accel()
        self._events = events
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._adopt_pending()
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._events = None

    def adopt(self, units: Sequence[ReplicaUnit]) -> None:
        self._to_adopt.extend(vmi for unit in units for vmi in unit.vmis)
        if self._nursery is not None:
            self._nursery.start_soon(self._adopt_pending)

    async def capacity(self) -> RackReport:
        return RackReport(
            nodes=(NodeInfo(name=self.settings.node, gpus=self.settings.gpu_count,
                            gpu_resource=None, infiniband=False),),
            overlay_network=False)

    async def create(self, unit: ReplicaUnit) -> None:
        """Boot the replica's VMs; one that runs (or ended and was not deleted) is kept."""
        self._running()
        refuse_isolated_network(unit, "qemu")
        for vmi in unit.vmis:
            self._check(vmi)
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                vm = self._vms.get(vmi.name) or self._find_live(vmi)
                if vm is None:
                    await self._start(vmi)
                else:
                    await self._send(vm, vm.phase, vm.message)

    async def restart(self, unit: ReplicaUnit) -> None:
        """Power the replica's VMs off, then boot them on the same disks with ``unit``'s
        configs."""
        self._running()
        for vmi in unit.vmis:
            self._check(vmi)
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                vm = self._vms.pop(vmi.name, None) or self._find_live(vmi)
                if vm is not None:
                    await self._stop(vm)
                    await self._send(vm, VmiPhase.GONE, "VM powered off for restart (disk kept)")
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                await self._start(vmi)

    async def delete(self, unit: ReplicaUnit) -> None:
        """Power the replica's VMs off and remove their folders (disks with them)."""
        self._running()
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                vm = self._vms.pop(vmi.name, None) or self._find_live(vmi)
                if vm is not None:
                    await self._stop(vm)
                    self._vms.pop(vmi.name, None)
                files = self._files(vmi)
                await trio.to_thread.run_sync(shutil.rmtree, files.folder, True)
                await self._send(vm or _Vm(vmi, files), VmiPhase.GONE,
                                 "VM powered off, disk removed")
            self._locks.pop(vmi.name, None)
        await trio.to_thread.run_sync(self._forget_unused_images)

    # -- beyond the interface --------------------------------------------------------

    async def stop_all(self) -> int:
        """Power off every VM of ``state_dir`` (known, or found in the folders); disks
        are kept. For ``cosmicac up``'s shutdown and tests. Returns how many."""
        vms = [vm for vm in self._vms.values() if not vm.exited.is_set()]
        known = {vm.files.folder for vm in vms}
        if self.state_dir.is_dir():
            for folder in sorted(self.state_dir.iterdir()):
                if folder.name != "images" and folder not in known:
                    found = self._vm_in(VmFiles(folder))
                    if found is not None:
                        vms.append(found)
        async with trio.open_nursery() as nursery:
            for vm in vms:
                nursery.start_soon(self._stop, vm)
        return len(vms)

    def files(self, vmi: VmiSpec) -> VmFiles:
        return self._files(vmi)

    def pid(self, name: str) -> int | None:
        vm = self._vms.get(name)
        return None if vm is None or vm.exited.is_set() else vm.pid

    # -- starting --------------------------------------------------------------------

    def _decide_accel(self) -> str:
        wanted = self.settings.accel
        if wanted == "tcg":
            return "tcg"
        problem = kvm_problem()
        if problem is None:
            return "kvm"
        if wanted == "kvm":
            raise BackendError(f"{problem}: the qemu backend was told to use KVM "
                               "(qemu.accel=kvm); qemu.accel=tcg emulates instead (slow)",
                               retryable=False)
        log.warning("qemu.no_kvm reason=%s: VMs run under software emulation (slow)", problem)
        return "tcg"

    def _running(self) -> trio.Nursery:
        if self._nursery is None:
            raise BackendError("the qemu backend is not running (start run() first)")
        return self._nursery

    def _lock(self, name: str) -> trio.Lock:
        return self._locks.setdefault(name, trio.Lock())

    def _check(self, vmi: VmiSpec) -> None:
        if vmi.node != self.settings.node:
            raise BackendError(f"{vmi.name}: placed on node {vmi.node!r}, but this host is "
                               f"{self.settings.node!r}", retryable=False)
        if vmi.gpus > self.settings.gpu_count:
            raise BackendError(f"{vmi.name}: {vmi.gpus} GPUs asked, this host has "
                               f"{self.settings.gpu_count}", retryable=False)

    def _files(self, vmi: VmiSpec) -> VmFiles:
        return VmFiles(self.state_dir / vmi.disk)

    def _image(self) -> GuestImage:
        disk = self.settings.image.resolve()
        manifest = disk.parent / "image.json"
        try:
            text = manifest.read_text()
        except OSError as exc:
            raise ImageError(f"no guest image at {disk} ({manifest}: {exc.strerror}); "
                             "build it: make image") from None
        image = read_image(disk, text)
        for path in (image.disk, *((image.kernel, image.initrd)
                                   if self.settings.kernel_boot else ())):
            if not path.is_file():
                raise ImageError(f"{path} is missing; build the image again: make image")
        return image

    def _frozen_base(self, image: GuestImage) -> Path:
        """The image as of now, under a name of its content's: overlays point at it."""
        key = json.loads((image.disk.parent / "image.json").read_text()).get("key", "")
        if not isinstance(key, str) or not key.isalnum():
            key = str(int(image.disk.stat().st_mtime_ns))
        images = self.state_dir / "images"
        images.mkdir(parents=True, exist_ok=True)
        base = images / f"{key}.qcow2"
        if not base.exists():
            partial = images / f".{key}.partial"
            partial.unlink(missing_ok=True)
            try:
                os.link(image.disk, partial)
            except OSError:
                shutil.copyfile(image.disk, partial)
            os.chmod(partial, 0o444)
            partial.rename(base)
        return base

    def _prepare(self, vmi: VmiSpec, image: GuestImage) -> None:
        """The VMI's folder, its disk (created once) and this start's seed."""
        files = self._files(vmi)
        files.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not files.disk.exists():
            base = self._frozen_base(image)
            partial = files.folder / "root.qcow2.partial"
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2",
                            "-b", str(base), str(partial), f"{self.settings.disk_size_gib}G"],
                           check=True, capture_output=True, timeout=60)
            partial.rename(files.disk)
        _make_vfat(files.seed, "CIDATA", seed_files(vmi, self.settings, self.agent_executable))
        files.hub_token.unlink(missing_ok=True)  # no stale token outlives its Secret
        if vmi.hub_token_secret is not None:
            token = read_hub_token(self.secrets_dir, vmi, log, "qemu")
            if token is not None:
                _make_vfat(files.hub_token, "HUBTOKEN", {HUB_TOKEN_KEY: token})
        for stale in (files.qmp, files.pidfile):
            stale.unlink(missing_ok=True)
        files.console.unlink(missing_ok=True)

    def _gpus_for(self, vmi: VmiSpec) -> tuple[str, ...]:
        if not self.settings.gpus or not vmi.gpus:
            return ()
        taken = {gpu for vm in self._vms.values() if not vm.exited.is_set() for gpu in vm.gpus}
        free = [gpu for gpu in self.settings.gpus if gpu not in taken]
        if len(free) < vmi.gpus:
            raise BackendError(f"{vmi.name}: {vmi.gpus} GPUs asked, {len(free)} free on "
                               "this host", retryable=True)
        return tuple(free[:vmi.gpus])

    async def _start(self, vmi: VmiSpec) -> None:
        nursery = self._running()
        assert self.accel is not None
        files = self._files(vmi)
        placeholder = _Vm(vmi, files)
        try:
            image = self._image()
            await self._send(placeholder, VmiPhase.PROVISIONING, "preparing the disk and seed")
            await trio.to_thread.run_sync(self._prepare, vmi, image)
        except ImageError as exc:
            await self._send(placeholder, VmiPhase.FAILED, str(exc))
            raise BackendError(f"{vmi.name}: {exc}", retryable=False) from None
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            message = f"cannot prepare {files.folder}: {exc}" + (
                f" ({detail.decode(errors='replace').strip()[:300]})" if detail else "")
            await self._send(placeholder, VmiPhase.FAILED, message)
            raise BackendError(f"{vmi.name}: {message}") from None
        gpus = self._gpus_for(vmi)
        argv = qemu_argv(vmi, self.settings, files, image, accel=self.accel, gpus=gpus,
                         hub_token=files.hub_token.exists())
        log_fd = os.open(files.folder / "qemu.log",
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            # A session of its own: Ctrl-C on the worker's terminal does not pull
            # the VMs' power; the worker (or `up`) powers them off.
            process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=files.folder)
        except OSError as exc:
            await self._send(placeholder, VmiPhase.FAILED,
                             f"cannot start {argv[0]}: {exc.strerror or exc}")
            raise BackendError(f"{vmi.name}: cannot start {argv[0]}: {exc.strerror or exc}",
                               retryable=False) from None
        finally:
            os.close(log_fd)
        stat = proc_stat(process.pid)
        vm = _Vm(vmi, files, gpus, process.pid, stat[1] if stat else None, process)
        self._vms[vmi.name] = vm
        write_atomically(files.record, (json.dumps({
            "pid": vm.pid, "start_ticks": vm.start_ticks, "vmi": vmi.name,
            "generation": vmi.agent.generation, "gpus": list(gpus),
            "started_at": time.time()}) + "\n").encode(), mode=0o600)
        nursery.start_soon(self._watch, vm)
        nursery.start_soon(self._follow_console, vm)
        log.info("qemu.started vmi=%s pid=%d accel=%s gpus=%s", vmi.name, vm.pid, self.accel,
                 ",".join(gpus) or "-")
        await self._send(vm, VmiPhase.BOOTING,
                         f"VM booting on {vmi.node} ({self.accel}, "
                         f"{self.settings.cpus(vmi.gpus)} vCPU, "
                         f"{self.settings.memory_mib(vmi.gpus)} MiB"
                         + (f", GPUs {', '.join(gpus)}" if gpus else "") + ")")

    # -- watching --------------------------------------------------------------------

    async def _watch(self, vm: _Vm) -> None:
        if vm.process is not None:
            returncode = await vm.process.wait()
            how, success = describe_exit(returncode), returncode == 0
        else:
            assert vm.pid is not None
            await wait_gone(vm.pid, vm.start_ticks, CONSOLE_POLL_S)
            how, success = "ended (exit status unknown: not a child of this worker)", False
        vm.exited.set()
        if vm.stopping:
            return
        if success:
            await self._send(vm, VmiPhase.SUCCEEDED, "VM stopped (guest shut down)")
            return
        said = last_line(vm.files.folder / "qemu.log")
        await self._send(vm, VmiPhase.FAILED, f"QEMU {how}" + (f": {said}" if said else ""))

    async def _follow_console(self, vm: _Vm) -> None:
        """Say the boot's milestones (kernel, systemd, cloud-init) as the console shows
        them, RUNNING once the kernel runs; then, while the VM lives, each line that
        says the guest is failing (:data:`FAILURE_MARKERS`, at most
        :data:`MAX_FAILURE_LINES`), each once."""
        pending = list(MILESTONES)
        said: set[str] = set()
        offset = 0
        partial = b""
        while not vm.exited.is_set() and len(said) < MAX_FAILURE_LINES:
            with trio.move_on_after(CONSOLE_POLL_S if pending else CONSOLE_IDLE_POLL_S):
                await vm.exited.wait()
            try:
                with vm.files.console.open("rb") as console:
                    console.seek(offset)
                    text = console.read(1 << 20)
            except OSError:
                continue
            offset += len(text)
            *lines, partial = (partial + text).split(b"\n")
            partial = partial[-4096:]  # a line never ends: keep its tail only
            for raw in lines:
                line = raw.decode(errors="replace").strip()
                if vm.stopping or vm.exited.is_set():
                    return
                for marker, what in list(pending):
                    if marker in line:
                        pending.remove((marker, what))
                        await self._send(vm, VmiPhase.RUNNING, f"VM {what}")
                if (any(marker in line for marker in FAILURE_MARKERS) and line not in said
                        and len(said) < MAX_FAILURE_LINES):
                    said.add(line)
                    await self._send(vm, vm.phase, f"VM console: {line[:300]}")

    # -- stopping --------------------------------------------------------------------

    async def _stop(self, vm: _Vm) -> None:
        """ACPI power button; after ``stop_grace_s`` SIGKILL; wait until gone."""
        vm.stopping = True
        if vm.pid is None or not self._still_running(vm):
            return
        try:
            await qmp_command(vm.files.qmp, "system_powerdown")
            with trio.move_on_after(self.settings.stop_grace_s):
                await self._gone(vm)
        except QmpError as exc:
            log.warning("qemu.powerdown_failed vmi=%s reason=%s", vm.name, exc)
        if self._still_running(vm):
            log.warning("qemu.killed vmi=%s pid=%d: the guest did not power off in %g s",
                        vm.name, vm.pid, self.settings.stop_grace_s)
            _kill(vm.pid, vm.start_ticks)
            with trio.move_on_after(KILL_WAIT_S):
                await self._gone(vm)
        if self._still_running(vm):
            raise BackendError(f"{vm.name}: QEMU {vm.pid} survives SIGKILL")
        log.info("qemu.stopped vmi=%s pid=%d", vm.name, vm.pid)

    async def _gone(self, vm: _Vm) -> None:
        if vm.process is not None:
            await vm.process.wait()
        else:
            assert vm.pid is not None
            await wait_gone(vm.pid, vm.start_ticks, CONSOLE_POLL_S)

    @staticmethod
    def _still_running(vm: _Vm) -> bool:
        if vm.pid is None:
            return False
        if vm.process is not None:
            return vm.process.poll() is None
        return is_alive(vm.pid, vm.start_ticks)

    # -- after a worker restart ------------------------------------------------------

    def _vm_in(self, files: VmFiles, spec: VmiSpec | None = None) -> _Vm | None:
        """The live VM recorded in ``files.folder``, if its pid and start time match."""
        try:
            record = json.loads(files.record.read_text())
            pid, ticks = int(record["pid"]), int(record["start_ticks"])
            gpus = tuple(str(gpu) for gpu in record.get("gpus", ()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not is_alive(pid, ticks):
            return None
        return _Vm(spec, files, gpus, pid, ticks)

    def _find_live(self, vmi: VmiSpec) -> _Vm | None:
        vm = self._vm_in(self._files(vmi), vmi)
        if vm is not None:
            self._vms[vmi.name] = vm
            self._running().start_soon(self._watch, vm)
        return vm

    async def _adopt_pending(self) -> None:
        while self._to_adopt:
            vmi = self._to_adopt.pop(0)
            async with self._lock(vmi.name):
                if vmi.name in self._vms:
                    continue
                vm = self._find_live(vmi)
                files = self._files(vmi)
                if vm is not None:
                    log.info("qemu.adopted vmi=%s pid=%d", vmi.name, vm.pid)
                    await self._send(vm, VmiPhase.RUNNING, f"VM (QEMU {vm.pid}) adopted")
                elif files.folder.is_dir():
                    dead = _Vm(vmi, files)
                    dead.exited.set()
                    self._vms[vmi.name] = dead
                    await self._send(dead, VmiPhase.FAILED,
                                     "VM gone while the worker was away (disk kept)")
                else:
                    await self._send(_Vm(vmi, files), VmiPhase.GONE, "no such VMI (no folder)")

    def _forget_unused_images(self) -> None:
        """Remove the frozen images no VMI's disk is backed by any more."""
        images = self.state_dir / "images"
        if not images.is_dir():
            return
        used = {Path(_backing_file(VmFiles(folder).disk)).name
                for folder in self.state_dir.iterdir()
                if folder != images and VmFiles(folder).disk.exists()}
        for base in images.glob("*.qcow2"):
            if base.name not in used:
                base.unlink(missing_ok=True)

    # -- events ----------------------------------------------------------------------

    async def _send(self, vm: _Vm, phase: VmiPhase, message: str) -> None:
        vm.phase, vm.message = phase, message
        if self._events is None or vm.spec is None:
            return
        extra = {"folder": str(vm.files.folder)}
        if vm.pid is not None:
            extra["pid"] = str(vm.pid)
        await self._events.send(VmiEvent(vm.name, phase, message, node=vm.spec.node,
                                         generation=vm.spec.agent.generation, extra=extra))


def kvm_problem(sys_module: Path = Path("/sys/module"),
                dev_kvm: Path = Path("/dev/kvm")) -> str | None:
    """Why a stock guest kernel cannot run under KVM here, or None when it can.

    Besides /dev/kvm opening, the hardware flavour must be loaded: a host that is
    itself a VM may offer only ``kvm_pvm`` (page-table based KVM for nested
    guests), under which a guest kernel built without PVM support never gets past
    its real-mode setup (seen: the Debian cloud kernel hangs after "Probing EDD").
    """
    try:
        os.close(os.open(dev_kvm, os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        return f"{dev_kvm}: {exc.strerror}"
    if not any((sys_module / name).is_dir() for name in ("kvm_intel", "kvm_amd")):
        flavours = sorted(p.name for p in sys_module.glob("kvm_*")) if sys_module.is_dir() else []
        return ("no hardware KVM (kvm_intel or kvm_amd) is loaded"
                + (f", only {', '.join(flavours)}" if flavours else ""))
    return None


def _make_vfat(disk: Path, label: str, content: Mapping[str, str | bytes]) -> None:
    """``disk``: a FAT image labelled ``label`` holding ``content``'s files, 0600
    (the NoCloud seed, ``CIDATA``; the hub token's disk)."""
    partial = disk.with_name(disk.name + ".partial")
    partial.unlink(missing_ok=True)
    staging = disk.with_name(disk.stem + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    try:
        for name, data in content.items():
            if isinstance(data, str):
                data = data.encode()
            (staging / name).write_bytes(data)
        subprocess.run(["mkfs.vfat", "-n", label, "-C", str(partial), "2048"],
                       check=True, capture_output=True, timeout=30)
        subprocess.run(["mcopy", "-i", str(partial),
                        *(str(staging / name) for name in content), "::/"],
                       check=True, capture_output=True, timeout=30)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    os.chmod(partial, 0o600)
    partial.rename(disk)


def _backing_file(disk: Path) -> str:
    try:
        info = subprocess.run(["qemu-img", "info", "--output=json", "-U", str(disk)],
                              check=True, capture_output=True, timeout=30)
        return str(json.loads(info.stdout).get("backing-filename", ""))
    except (OSError, subprocess.SubprocessError, ValueError):
        return ""


def _kill(pid: int, start_ticks: int | None) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if is_alive(pid, start_ticks):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)
