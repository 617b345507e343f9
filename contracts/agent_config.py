"""The agent's config: rendered by the worker, parsed by the agent.

The ``kubevirt`` backend writes it as JSON into the VMI's cloud-init user data
(kept in a Secret, because it holds the replica's report token); the ``local``
backend writes the same JSON to a file beside the agent process. The agent
reads it with :func:`load_agent_config`, so a field means one thing on both
sides and a bad file is refused with the field named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)

from p2p.daemon import parse_address

from .model import JobType, KeyHex, Runtime, first_error

__all__ = [
    "AGENT_CONFIG_PATH",
    "IB_HCA_MAX_CHARS",
    "IB_HCA_PATTERN",
    "IFNAME_PATTERN",
    "AgentConfig",
    "AgentConfigError",
    "load_agent_config",
]

#: Where cloud-init writes the config inside a VMI.
AGENT_CONFIG_PATH = "/etc/cosmicac/agent.json"
#: A Linux network interface name: at most 15 characters (IFNAMSIZ is 16 with
#: the NUL), no ``/``, blank or ``:``, not ``.``/``..`` (net/core/dev.c's
#: ``dev_valid_name``), kept to the letters, digits and ``_.-`` interfaces are
#: really called by. It ends up in ``NCCL_SOCKET_IFNAME``, where a leading
#: ``^`` or ``=`` and commas would change the meaning: none of them passes.
IFNAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,14}$"
#: ``NCCL_IB_HCA`` (NCCL's environment variables doc): an optional ``^``
#: (exclude these) or ``=`` (exact names, not prefixes), then a comma-separated
#: list of ``name[:port]``; at most 32 entries.
IB_HCA_PATTERN = (r"^[\^=]?[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}(:[0-9]{1,3})?"
                  r"(,[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}(:[0-9]{1,3})?){0,31}$")
#: Bound on ``NCCL_IB_HCA``: 32 HCAs with ports fit in far less.
IB_HCA_MAX_CHARS = 256


class AgentConfigError(Exception):
    """The agent's config file is missing, unreadable or invalid."""


def _address_text(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: An ``(ip, port)`` pair, parsed once when the config is read (``host:port``,
#: ``[v6]:port`` or a pair; the host an IP address) and written as ``host:port``:
#: the file reads the same to an agent of any version.
ConfigAddress = Annotated[tuple[str, int], BeforeValidator(parse_address),
                          PlainSerializer(_address_text, return_type=str)]


class AgentConfig(BaseModel):
    """Everything an agent needs to boot, join the swarm and report."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Bumped when a field changes meaning; an agent refuses a newer one.
    version: Literal[1] = 1
    job_id: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9\-]*$")
    replica: int = Field(ge=0, lt=1024)
    #: Restart count of the replica this VMI belongs to.
    generation: int = Field(default=0, ge=0)
    #: This VMI's place in a multi-node replica (0 is the head) and how many
    #: VMIs the replica has.
    node_rank: int = Field(default=0, ge=0)
    node_count: int = Field(default=1, ge=1, le=64)
    job_type: JobType
    runtime: Runtime | None = None
    model: str | None = None
    #: The name requests use for the model (``JobSpec.serves_as``).
    served_name: str | None = Field(default=None, max_length=200)
    #: A multi-node replica's head: the rank-0 VMI's address on the overlay
    #: network, where Ray's head listens. None on a single-node replica.
    head_address: str | None = Field(default=None, max_length=253)
    #: The overlay network's interface inside the VMI (``eth1``), where NCCL,
    #: Gloo and TensorPipe open their sockets (``NCCL_SOCKET_IFNAME``…) and
    #: whose address this VMI gives Ray. None: a single-node replica, or let
    #: NCCL choose.
    overlay_interface: str | None = Field(default=None, pattern=IFNAME_PATTERN)
    #: The InfiniBand HCAs NCCL uses (``NCCL_IB_HCA``, e.g. ``mlx5`` or
    #: ``=mlx5_0:1,mlx5_1:1``). None: a single-node replica, or NCCL's default.
    ib_hca: str | None = Field(default=None, max_length=IB_HCA_MAX_CHARS,
                               pattern=IB_HCA_PATTERN)
    #: GPUs this VMI holds.
    gpus: int = Field(ge=0)
    #: Appended to the model server's command line: the model master's
    #: arguments, then the job's (contracts/runtime_settings.py).
    runtime_args: tuple[str, ...] = Field(default=(), max_length=128)
    #: Laid over the model server's environment: the master's, then the job's.
    runtime_env: dict[str, str] = Field(default={}, max_length=128)
    #: A file inside the VMI holding the model hub's token (the model master's
    #: ``hub_token_secret``, mounted there by the backend); given to the model
    #: server as ``HF_TOKEN``. The token itself is never in this config.
    hub_token_file: str | None = Field(default=None, max_length=4096)
    #: A folder shared by the VMIs of this host or cluster where model weights
    #: stay between starts (``HF_HOME``); None: the runtime's own default.
    model_cache_dir: str | None = Field(default=None, max_length=4096)
    #: The worker the agent reports to (its swarm public key).
    worker: KeyHex
    #: Addresses where the worker listens, tried before the DHT (``host:port``).
    worker_addresses: tuple[ConfigAddress, ...] = Field(default=(), max_length=16)
    #: Secret that proves to the worker which replica this agent is (64 hex).
    report_token: str = Field(pattern=r"^[0-9a-f]{64}$", repr=False)
    #: DHT bootstrap nodes (``host:port``).
    bootstrap: tuple[ConfigAddress, ...] = Field(default=(), max_length=64)
    #: Relays the agent reserves with when inbound connections are blocked;
    #: fixed when the job was created (seeds/relay.txt). The worker holds a
    #: reservation on them too: an agent that cannot reach it comes through one.
    relays: tuple[KeyHex, ...] = Field(default=(), max_length=16)
    #: Where those relays listen (``{key: ["host:port"]}``, the worker's setting
    #: now): reached with no DHT, from a network that reaches only the relay box.
    relay_addresses: dict[KeyHex, tuple[ConfigAddress, ...]] = Field(default={},
                                                                      max_length=16)
    #: Who may use the workload: the users' keys allowed to open shells (a GPU
    #: Container Job), or the proxy-inference keys allowed to send requests
    #: (a Managed Inference Job).
    authorized_keys: tuple[KeyHex, ...] = Field(default=(), max_length=1024)
    #: The version of ``authorized_keys`` for a GPU Container Job: the team's
    #: shell keys as the worker last heard them (contracts/shell_access.py); the
    #: agent takes only newer sets after it. 0: as the job was created.
    shell_keys_version: int = Field(default=0, ge=0, lt=2**63)
    #: How often the agent tells the worker it is alive.
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=3600)
    #: The agent's folder: identity and state. Inside a VMI a fixed path.
    storage: str = "/var/lib/cosmicac-agent"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: Ship the agent's log records (its own as System, its model server's
    #: output as Application) to the worker with ``agent.logs``, which forwards
    #: them to wrk-monitor. The worker sets it when its own telemetry is on.
    telemetry: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> AgentConfig:
        if self.node_rank >= self.node_count:
            raise ValueError("node_rank must be below node_count")
        return self

    def to_json(self) -> str:
        """The config as the worker writes it (indented, keys sorted)."""
        data = self.model_dump(mode="json")
        if not data["telemetry"]:
            # Added after version 1 shipped: left out when off, so that an agent
            # image older than its worker still reads the config it is given.
            del data["telemetry"]
        if not data["shell_keys_version"]:
            del data["shell_keys_version"]  # likewise
        if not data["relay_addresses"]:
            del data["relay_addresses"]  # likewise
        for added_later in ("overlay_interface", "ib_hca", "hub_token_file",
                            "model_cache_dir", "runtime_args", "runtime_env"):
            if not data[added_later]:
                del data[added_later]  # likewise
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def load_agent_config(path: str | Path) -> AgentConfig:
    """Read and validate an agent config file.

    Raises:
        AgentConfigError: unreadable, not JSON, or a field is wrong (named).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AgentConfigError(f"cannot read agent config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AgentConfigError(f"agent config {path} is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise AgentConfigError(f"agent config {path} is not valid JSON: {exc}") from None
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise AgentConfigError(f"agent config {path}: {first_error(exc, 'config')}") from None
