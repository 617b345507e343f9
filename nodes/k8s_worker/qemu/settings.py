"""Settings of the ``qemu`` backend: one host, its GPUs, the guest image, the VMs' size."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["QemuSettings"]

#: A PCI address as sysfs names it (domain:bus:device.function).
_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class QemuSettings(BaseModel):
    """One machine with ``/dev/kvm`` runs every VMI as a KVM virtual machine.

    The worker's settings nest it (``qemu__image``, ``qemu__gpus``…).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The guest image ``make image`` builds (deploy/image): a qcow2 disk each VMI
    #: boots from through a copy-on-write overlay of its own.
    image: Path = Path("build/image/cosmicac-guest.qcow2")
    #: Boot the kernel and initrd found beside the image (``vmlinuz``,
    #: ``initrd.img``, ``image.json``'s command line) instead of the disk's UEFI
    #: boot manager: the same guest, a few seconds sooner. False: UEFI (OVMF), as
    #: KubeVirt boots the disk.
    kernel_boot: bool = True
    #: The UEFI firmware when not booting kernel-first (Debian's ``ovmf``).
    firmware: Path = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
    #: The node name this host reports to wrk-ork (one host, one node).
    node: str = Field(default="qemu-node-1", min_length=1, max_length=253,
                      pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    #: GPUs handed to VMs by VFIO passthrough, by PCI address (``0000:3b:00.0``);
    #: each must be bound to ``vfio-pci`` on the host. A VMI gets as many as its
    #: share of the replica, each GPU to one VMI at a time.
    gpus: tuple[str, ...] = Field(default=(), max_length=64)
    #: GPUs reported without a device behind them, on a machine with none (demos,
    #: tests): placed like real ones, nothing is passed to the VM.
    unbacked_gpus: int = Field(default=0, ge=0, le=64)
    #: Virtual CPUs and memory of a VMI: per GPU of its share, with a floor for a
    #: VMI without GPUs (and for small shares).
    cpus_per_gpu: int = Field(default=4, ge=1, le=256)
    memory_mib_per_gpu: int = Field(default=8192, ge=256, le=4 * 1024 * 1024)
    min_cpus: int = Field(default=2, ge=1, le=256)
    min_memory_mib: int = Field(default=2048, ge=256, le=4 * 1024 * 1024)
    #: The root disk each VMI sees: the overlay's virtual size (cloud-init grows
    #: the root file system to it on first boot).
    disk_size_gib: int = Field(default=20, ge=2, le=65536)
    #: ``user``: QEMU's user-mode network: the guest reaches this host's loopback
    #: at ``host_alias`` and nothing needs root; the platform reaches the agent
    #: through the relays (as it does agents on a cluster network it cannot
    #: enter).
    network: Literal["user"] = "user"
    #: The host's loopback as the guest sees it on the user-mode network: the
    #: agent's config says this instead of 127.0.0.1.
    host_alias: str = "10.0.2.2"
    qemu: str = "qemu-system-x86_64"
    #: Where model masters' hub token Secrets are, as ``<name>/token`` files
    #: (a mounted Kubernetes Secret's layout). Unset: ``secrets/`` in the
    #: worker's storage. A VM gets its token on a small read-only disk.
    secrets_dir: Path | None = None
    #: ``kvm`` (refuses to start without /dev/kvm), ``tcg`` (software emulation:
    #: slow, for a machine without KVM), ``auto``: kvm when /dev/kvm opens.
    accel: Literal["auto", "kvm", "tcg"] = "auto"
    #: ACPI power button first (the guest shuts down cleanly), then the VM is
    #: killed after this long.
    stop_grace_s: float = Field(default=20.0, gt=0, le=600)

    @field_validator("gpus")
    @classmethod
    def _pci_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            if not _PCI.match(address):
                raise ValueError(f"{address!r} is not a PCI address like 0000:3b:00.0")
        if len(set(value)) != len(value):
            raise ValueError("a GPU is listed twice")
        return value

    @field_validator("host_alias")
    @classmethod
    def _private_ipv4(cls, value: str) -> str:
        try:
            address = ipaddress.IPv4Address(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IPv4 address") from exc
        if not address.is_private or address.is_loopback:
            raise ValueError(f"{value} is not a private address (the guest's network is "
                             "private to the VM)")
        return value

    @model_validator(mode="after")
    def _one_kind_of_gpu(self) -> QemuSettings:
        if self.gpus and self.unbacked_gpus:
            raise ValueError("list gpus (passed through) or unbacked_gpus, not both")
        return self

    @property
    def gpu_count(self) -> int:
        return len(self.gpus) or self.unbacked_gpus

    def cpus(self, gpus: int) -> int:
        return max(self.min_cpus, gpus * self.cpus_per_gpu)

    def memory_mib(self, gpus: int) -> int:
        return max(self.min_memory_mib, gpus * self.memory_mib_per_gpu)
