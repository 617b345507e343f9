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

from contracts.agent_config import AGENT_CONFIG_PATH, AgentConfig

__all__ = ["AGENT_UNIT", "cloud_init_meta_data", "cloud_init_user_data"]

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


def cloud_init_user_data(agent: AgentConfig, agent_executable: str = "cosmicac") -> str:
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


def cloud_init_meta_data(instance_id: str, hostname: str) -> str:
    """NoCloud ``meta-data``: the instance id and the guest's host name.

    The id must stay the same across a restart that keeps the disk (as
    KubeVirt's, derived from the VMI's name and namespace, does): cloud-init
    then runs only its per-boot modules, and ``bootcmd`` above starts the agent
    with the new config.
    """
    return (f"instance-id: {json.dumps(instance_id)}\n"
            f"local-hostname: {json.dumps(hostname)}\n")
