"""The ``qemu`` worker backend: each VMI a KVM virtual machine on the worker's host."""

from .backend import QemuBackend
from .launch import GuestImage, ImageError, VmFiles, guest_agent_config, qemu_argv, seed_files
from .settings import QemuSettings

__all__ = ["GuestImage", "ImageError", "QemuBackend", "QemuSettings", "VmFiles",
           "guest_agent_config", "qemu_argv", "seed_files"]
