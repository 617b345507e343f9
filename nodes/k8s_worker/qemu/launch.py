"""Pure: a VMI → the files of its VM and the QEMU command line that boots it.

Nothing here does I/O; :mod:`.backend` writes the files and runs the command.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from contracts.agent_config import AgentConfig

from ..backend import VmiSpec
from ..cloud_init import (
    GUEST_HUB_TOKEN_FILE,
    HUB_TOKEN_SERIAL,
    cloud_init_meta_data,
    cloud_init_user_data,
    hub_token_mount,
)
from .settings import QemuSettings

__all__ = ["GuestImage", "ImageError", "VmFiles", "guest_agent_config", "qemu_argv",
           "read_image", "seed_files"]


class ImageError(Exception):
    """The guest image (or what its build wrote beside it) is missing or unreadable."""


@dataclass(frozen=True)
class GuestImage:
    """What ``make image`` wrote: the disk and, beside it, the kernel to boot first."""

    disk: Path
    kernel: Path
    initrd: Path
    cmdline: str


def read_image(disk: Path, manifest_text: str) -> GuestImage:
    """The image whose ``image.json`` (beside ``disk``) reads ``manifest_text``."""
    try:
        manifest = json.loads(manifest_text)
        cmdline = manifest["cmdline"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ImageError(f"{disk.parent / 'image.json'} is not the manifest make image "
                         f"writes ({exc}); build the image again: make image") from exc
    if not isinstance(cmdline, str) or not cmdline or "\n" in cmdline:
        raise ImageError(f"{disk.parent / 'image.json'}: no kernel command line")
    return GuestImage(disk=disk, kernel=disk.parent / "vmlinuz",
                      initrd=disk.parent / "initrd.img", cmdline=cmdline)


@dataclass(frozen=True)
class VmFiles:
    """A VMI's folder on the worker's host: its disk, seed, console and sockets."""

    folder: Path

    @property
    def disk(self) -> Path:
        """The root disk: a qcow2 overlay on the image, kept across restarts."""
        return self.folder / "root.qcow2"

    @property
    def seed(self) -> Path:
        """The NoCloud ``cidata`` disk, made anew at every start."""
        return self.folder / "seed.img"

    @property
    def hub_token(self) -> Path:
        """The disk carrying the model hub's token (serial ``cac-hub-token``), made
        anew at every start of a VMI whose model master names a Secret."""
        return self.folder / "hub-token.img"

    @property
    def console(self) -> Path:
        """What the guest prints on its serial console (kernel, systemd, cloud-init)."""
        return self.folder / "console.log"

    @property
    def qmp(self) -> Path:
        """QEMU's machine protocol socket: power button, quit, status."""
        return self.folder / "qmp.sock"

    @property
    def pidfile(self) -> Path:
        return self.folder / "qemu.pid"

    @property
    def record(self) -> Path:
        """What the worker needs to find the VM again after a restart (JSON)."""
        return self.folder / "vm.json"


def _on_loopback(address: tuple[str, int]) -> bool:
    host = address[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _network(alias: str) -> str:
    """The user-mode network around the host's alias (a /24)."""
    return str(ipaddress.ip_network(f"{alias}/24", strict=False))


def guest_agent_config(agent: AgentConfig, settings: QemuSettings, *,
                       hub_token: bool = False) -> AgentConfig:
    """``agent`` as the guest must read it.

    With ``hub_token`` it names the token file of the hub token disk's mount.

    The host's loopback addresses (the worker's and the relays' on a one-machine
    platform) become the user-mode network's alias of the host. A DHT bootstrap on
    the loopback is dropped instead: the records of a DHT on the host's loopback
    name loopback addresses, which the guest cannot reach, and its join never
    settled (seen: the agent's swarm waited minutes); the agent reaches the worker
    and the relays by address, and the platform reaches the agent through them.
    Other addresses are kept.
    """
    alias = settings.host_alias

    def moved(addresses: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
        return tuple((alias, port) if _on_loopback((host, port)) else (host, port)
                     for host, port in addresses)

    return agent.model_copy(update={
        "worker_addresses": moved(agent.worker_addresses),
        **({"hub_token_file": GUEST_HUB_TOKEN_FILE} if hub_token else {}),
        "bootstrap": tuple(address for address in agent.bootstrap
                           if not _on_loopback(address)),
        "relay_addresses": {key: moved(addresses)
                            for key, addresses in agent.relay_addresses.items()},
    })


def seed_files(vmi: VmiSpec, settings: QemuSettings,
               agent_executable: str = "cosmicac") -> dict[str, str]:
    """The NoCloud seed's files: the user data the kubevirt backend puts in its
    Secret (one renderer), and the meta-data KubeVirt would write (the instance id
    is the VMI's name, the same across restarts, as KubeVirt's)."""
    token = vmi.hub_token_secret is not None
    return {
        "user-data": cloud_init_user_data(
            guest_agent_config(vmi.agent, settings, hub_token=token), agent_executable,
            [hub_token_mount()] if token else []),
        "meta-data": cloud_init_meta_data(vmi.name, vmi.name),
    }


def qemu_argv(vmi: VmiSpec, settings: QemuSettings, files: VmFiles, image: GuestImage, *,
              accel: str, gpus: Sequence[str] = (), hub_token: bool = False) -> list[str]:
    """The command line of ``vmi``'s VM.

    ``accel`` is ``kvm`` or ``tcg`` (decided by the backend); ``gpus`` the PCI
    addresses given to this VM (passed through with VFIO); ``hub_token``: attach
    the hub token disk (:attr:`VmFiles.hub_token`).
    """
    argv = [
        settings.qemu,
        "-name", f"guest={vmi.name},debug-threads=on",
        "-machine", f"q35,accel={accel}",
        "-cpu", "host" if accel == "kvm" else "max",
        "-smp", str(settings.cpus(vmi.gpus)),
        "-m", f"{settings.memory_mib(vmi.gpus)}M",
        # Nothing but what is listed: no default NIC, VGA, floppy or CD-ROM.
        "-nodefaults", "-no-user-config", "-display", "none",
        "-serial", f"file:{files.console}",
        # Relative: QEMU runs in the VM's folder, whose path may be longer than a
        # unix socket's may be (108 bytes).
        "-qmp", f"unix:{files.qmp.name},server=on,wait=off",
        "-pidfile", str(files.pidfile),
        "-drive", f"if=none,id=root,file={files.disk},format=qcow2,discard=unmap",
        "-device", "virtio-blk-pci,drive=root,bootindex=1",
        "-drive", f"if=none,id=seed,file={files.seed},format=raw,readonly=on",
        "-device", "virtio-blk-pci,drive=seed",
        *(["-drive", f"if=none,id=hubtoken,file={files.hub_token},format=raw,readonly=on",
            "-device", f"virtio-blk-pci,drive=hubtoken,serial={HUB_TOKEN_SERIAL}"]
          if hub_token else []),
        "-netdev", f"user,id=net0,net={_network(settings.host_alias)},host={settings.host_alias}",
        "-device", "virtio-net-pci,netdev=net0",
        # The guest's kernel wants entropy at boot; without it early services wait.
        "-device", "virtio-rng-pci",
    ]
    if settings.kernel_boot:
        argv += ["-kernel", str(image.kernel), "-initrd", str(image.initrd),
                 "-append", image.cmdline]
    else:
        argv += ["-drive", f"if=pflash,format=raw,readonly=on,file={settings.firmware}"]
    for address in gpus:
        argv += ["-device", f"vfio-pci,host={address}"]
    return argv
