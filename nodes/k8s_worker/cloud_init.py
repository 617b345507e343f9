"""The cloud-init NoCloud seed of a VMI: one renderer for every backend that boots VMs.

The ``kubevirt`` backend puts the user data in a Secret that KubeVirt's
``cloudInitNoCloud`` turns into the guest's ``cidata`` disk; the ``qemu``
backend builds that disk itself, with the meta-data KubeVirt would write. The
guest image (``deploy/image``) needs systemd, coreutils' ``base64`` and the
``cosmicac`` executable; the agent's unit is a transient one this user data
starts, so any image with those works.

Pure: nothing here does I/O.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.agent_config import AGENT_CONFIG_PATH, AgentConfig
from contracts.runtime_settings import HUB_TOKEN_KEY

__all__ = [
    "AGENT_UNIT",
    "GUEST_HUB_TOKEN_FILE",
    "GUEST_MODEL_CACHE",
    "HUB_TOKEN_SERIAL",
    "MODEL_CACHE_TAG",
    "GuestMount",
    "cloud_init_meta_data",
    "cloud_init_user_data",
    "hub_token_mount",
    "model_cache_mount",
]

#: The serial of the disk that carries the hub token Secret (a virtio-blk
#: serial: at most 20 bytes); udev names it ``/dev/disk/by-id/virtio-<serial>``.
HUB_TOKEN_SERIAL = "cac-hub-token"
_HUB_TOKEN_DIR = "/run/cosmicac/hub-token"
#: Where the agent reads the hub token inside a VM (the Secret's key as a file).
GUEST_HUB_TOKEN_FILE = f"{_HUB_TOKEN_DIR}/{HUB_TOKEN_KEY}"
#: The shared model cache's mount tag (virtiofs) and place inside a VM.
MODEL_CACHE_TAG = "model-cache"
GUEST_MODEL_CACHE = "/var/cache/cosmicac/models"


@dataclass(frozen=True)
class GuestMount:
    """A file system the guest mounts on every boot, before the agent starts."""

    source: str
    target: str
    fstype: str
    options: str
    #: The mount point's mode: 0700 keeps the token's folder root's alone
    #: (an ISO9660 Secret disk shows its files world-readable).
    mode: str = "0755"


def hub_token_mount() -> GuestMount:
    """The hub token Secret's disk (an ISO under KubeVirt, a FAT image under qemu)."""
    return GuestMount(f"/dev/disk/by-id/virtio-{HUB_TOKEN_SERIAL}", _HUB_TOKEN_DIR, "auto",
                      "ro,nodev,nosuid,noexec", mode="0700")


def model_cache_mount(fstype: str = "virtiofs") -> GuestMount:
    """The model cache shared by the VMs (a virtiofs file system tagged
    :data:`MODEL_CACHE_TAG`)."""
    return GuestMount(MODEL_CACHE_TAG, GUEST_MODEL_CACHE, fstype, "rw,nodev,nosuid")


#: Every boot: wait for udev to name the disks, then mount $1 on $2 (type $3,
#: options $4, mount point mode $5) unless something is mounted there already.
#: A failure is said on the console and leaves the boot going: the agent then
#: reports what it misses (a token file it cannot read) to the worker.
_MOUNT_SCRIPT = (
    'udevadm settle --timeout=30 2>/dev/null; '
    'mkdir -p "$2" && chmod "$5" "$2" && '
    '{ mountpoint -q "$2" || mount -t "$3" -o "$4" "$1" "$2" || '
    'echo "cosmicac: cannot mount $1 on $2" >&2; }'
)

#: systemd unit the agent runs as (a transient one: the image needs systemd,
#: not a unit file of ours); restarted by systemd if it crashes.
AGENT_UNIT = "cosmicac-agent"

#: Every boot after the first: rewrite the config from this boot's user data
#: and start the agent. $1 config path, $2 config (base64), $3 executable,
#: $4 unit. Does nothing on the first boot (no config yet), when write_files
#: and runcmd do the work.
_REBOOT_SCRIPT = (
    'test -e "$1" || exit 0; umask 077; '
    'printf %s "$2" | base64 -d > "$1.new" && mv -f "$1.new" "$1" && '
    'systemd-run --no-block --unit="$4" -p Restart=on-failure '
    '-p StandardOutput=journal+console -p StandardError=journal+console '
    '-- "$3" agent run --config "$1"'
)


#: Every boot, in the background (the interface may still wait for its DHCP
#: answer): route $1 via $2, retrying for up to two minutes.
_ROUTE_SCRIPT = (
    '( for _ in $(seq 120); do ip route replace "$1" via "$2" 2>/dev/null && exit 0; '
    'sleep 1; done; echo "cosmicac: cannot route $1 via $2" >&2 ) &'
)


def cloud_init_user_data(agent: AgentConfig, agent_executable: str = "cosmicac",
                         mounts: Sequence[GuestMount] = (),
                         routes: Sequence[tuple[str, str]] = ()) -> str:
    """The ``#cloud-config`` that installs the agent's config and starts the agent.

    First boot: ``write_files`` puts the JSON at :data:`AGENT_CONFIG_PATH`,
    readable by root only (it holds the report token), and ``runcmd`` starts
    ``cosmicac agent run --config …`` as the transient systemd unit
    :data:`AGENT_UNIT` (not in the foreground: that would hold cloud-init's
    final stage forever).

    Later boots: a restart keeps the root disk and KubeVirt derives the
    NoCloud instance-id from the VMI's name and namespace, so cloud-init
    sees the same instance and skips its per-instance modules, write_files
    and runcmd among them. ``bootcmd`` runs on every boot with the user data
    of *that* boot, so it rewrites the config (the new generation's) and
    starts the agent; on the first boot it finds no config and does nothing.

    ``mounts`` are mounted by ``bootcmd`` on every boot, before the agent
    starts (a Secret's disk, the shared model cache). ``routes``
    (destination, gateway) are added on every boot (an isolated network's
    tunnel, through its WireGuard gateway).

    Everything variable is embedded as JSON strings (valid YAML scalars) and
    passed to the shell as positional arguments, never spliced into the
    script, so nothing in the config can break the YAML or the shell.
    """
    config = agent.to_json()
    path = AGENT_CONFIG_PATH
    # The agent's output goes to the journal and to the serial console too: until
    # it reaches the worker (which then gets its log records) the console is the
    # one place an operator sees why an agent does not come up.
    start = ["systemd-run", "--no-block", f"--unit={AGENT_UNIT}", "-p", "Restart=on-failure",
             "-p", "StandardOutput=journal+console", "-p", "StandardError=journal+console",
             "--", agent_executable, "agent", "run", "--config", path]
    reboot = ["sh", "-c", _REBOOT_SCRIPT, "cosmicac-boot", path,
              base64.b64encode(config.encode()).decode("ascii"), agent_executable,
              AGENT_UNIT]
    lines = [
        "#cloud-config",
        "bootcmd:",
        *(f"  - {json.dumps(_mount_command(mount))}" for mount in mounts),
        *(f"  - {json.dumps(['sh', '-c', _ROUTE_SCRIPT, 'cosmicac-route', to, via])}"
          for to, via in routes),
        f"  - {json.dumps(reboot)}",
        "write_files:",
        f"  - path: {path}",
        "    owner: root:root",
        "    permissions: '0600'",
        f"    content: {json.dumps(config)}",
        "runcmd:",
        f"  - {json.dumps(start)}",
    ]
    return "\n".join(lines) + "\n"


def _mount_command(mount: GuestMount) -> list[str]:
    return ["sh", "-c", _MOUNT_SCRIPT, "cosmicac-mount", mount.source, mount.target,
            mount.fstype, mount.options, mount.mode]


def cloud_init_meta_data(instance_id: str, hostname: str) -> str:
    """NoCloud ``meta-data``: the instance id and the guest's host name.

    The id must stay the same across a restart that keeps the disk (as
    KubeVirt's, derived from the VMI's name and namespace, does): cloud-init
    then runs only its per-boot modules, and ``bootcmd`` above starts the agent
    with the new config.
    """
    return (f"instance-id: {json.dumps(instance_id)}\n"
            f"local-hostname: {json.dumps(hostname)}\n")
