"""What an inference job's model server is started with, beyond what the platform sets.

Two levels, as seeds/architecture.txt's model masters and jobs have:

- a **model master** (operators only) carries :class:`ModelRuntimeSettings`:
  extra command-line arguments and environment for every job of that model
  (``--max-model-len 8192``, ``--dtype bfloat16``, ``--quantization awq``,
  ``VLLM_ATTENTION_BACKEND``…) and the Kubernetes Secret holding the token of
  a gated model hub (``hub_token_secret``);
- a **job** (its team) carries :class:`RuntimeSettings`: arguments and
  environment of its own, laid over the master's (arguments after the
  master's, so a repeated flag takes the job's value; a variable of the same
  name replaces the master's).

A job's environment may not name what the platform sets or what could send
the hub token elsewhere or run other code: the loader's and Python's hooks
(``LD_*``, ``PYTHON*``, ``PATH``), the model hub's settings (``HF_*``: a job
that set ``HF_ENDPOINT`` would send the master's token to its own server),
Ray's, and the variables the vLLM adapter sets for the overlay network. An
operator can set any of them on the model master.

Neither level may repeat a flag the runtime's adapter sets itself (the port,
the served name, the parallel sizes): :data:`MANAGED_FLAGS`, which the
agents' adapters enforce too.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

__all__ = [
    "HUB_TOKEN_KEY",
    "MANAGED_FLAGS",
    "ModelRuntimeSettings",
    "RuntimeSettings",
    "job_env_problem",
    "managed_flag_problem",
    "merged_runtime_settings",
]

#: The key of a hub token Secret that holds the token (``kubectl create secret
#: generic NAME --from-literal=token=hf_…``).
HUB_TOKEN_KEY = "token"

#: Flags each runtime's adapter sets; neither level may repeat them (an
#: ``--opt=value`` form counts).
#: Keyed by the runtime's name (``contracts.model.Runtime`` values; that module
#: imports this one).
MANAGED_FLAGS: dict[str, tuple[str, ...]] = {
    "vllm": ("--host", "--port", "--served-model-name", "--tensor-parallel-size", "-tp",
                   "--pipeline-parallel-size", "-pp", "--distributed-executor-backend",
                   "--model"),
    "parakeet": ("--model", "--host", "--port", "--served-name", "--device"),
    "local": ("--model", "--host", "--port", "--served-name"),
}

#: Prefixes and names a job's environment may not set (see the module doc).
_JOB_ENV_DENIED_PREFIXES = ("LD_", "PYTHON", "HF_", "HUGGING_FACE_", "RAY_")
_JOB_ENV_DENIED = frozenset({
    "PATH", "HOME", "VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME", "NCCL_IB_HCA", "CUDA_VISIBLE_DEVICES",
})

_ARG = Annotated[str, StringConstraints(min_length=1, max_length=1024,
                                        pattern=r"^[^\x00-\x1f\x7f]+$")]
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: A Kubernetes object name (DNS-1123 subdomain).
_SECRET_NAME = r"^[a-z0-9]([a-z0-9\-.]{0,251}[a-z0-9])?$"


def managed_flag_problem(runtime: str, args: tuple[str, ...] | list[str],
                         managed: tuple[str, ...] | None = None) -> str | None:
    """Why ``args`` cannot go on ``runtime``'s command line, or None.

    ``--port 9`` and ``--port=9`` are both caught; so is any unambiguous prefix
    argparse would expand (``--por``), since vLLM's parser allows
    abbreviations. ``managed``: the flags (default: :data:`MANAGED_FLAGS`).
    """
    owned_flags = MANAGED_FLAGS.get(str(runtime), ()) if managed is None else managed
    for arg in args:
        if not arg.startswith("-"):
            continue
        flag = arg.split("=", 1)[0]
        for owned in owned_flags:
            long_prefix = flag.startswith("--") and len(flag) > 3 and owned.startswith(flag)
            if flag == owned or long_prefix:
                return f"{arg!r} would override {owned}, which the platform sets for {runtime}"
    return None


def job_env_problem(name: str) -> str | None:
    """Why a job may not set environment variable ``name``, or None."""
    upper = name.upper()
    if upper in _JOB_ENV_DENIED or upper.startswith(_JOB_ENV_DENIED_PREFIXES):
        return (f"{name} is set by the platform or could redirect the model hub's token; "
                "an operator can set it on the model master")
    return None


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Appended to the model server's command line, in order.
    args: tuple[_ARG, ...] = Field(default=(), max_length=64)
    #: Laid over the model server's environment.
    env: dict[str, str] = Field(default_factory=dict, max_length=64)

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name "
                                 "(letters, digits and _, not starting with a digit)")
            if len(value) > 4096 or "\x00" in value:
                raise ValueError(f"the value of {name} must be at most 4096 characters, "
                                 "without NUL")
        return env

    @property
    def empty(self) -> bool:
        return not self.args and not self.env


class RuntimeSettings(_Settings):
    """A job's own arguments and environment for its model server."""

    @field_validator("env")
    @classmethod
    def _job_env(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            problem = job_env_problem(name)
            if problem is not None:
                raise ValueError(problem)
        return env


class ModelRuntimeSettings(_Settings):
    """A model master's arguments, environment and hub token for every job of the model."""

    #: The Kubernetes Secret (in the worker's namespace) whose key ``token``
    #: is the model hub's access token; the ``local`` and ``qemu`` backends
    #: read ``<secrets folder>/<name>/token`` instead. Given to the model
    #: server as ``HF_TOKEN``; never stored in the job or the database.
    hub_token_secret: str | None = Field(default=None, max_length=253, pattern=_SECRET_NAME)

    @property
    def empty(self) -> bool:
        return super().empty and self.hub_token_secret is None


def merged_runtime_settings(master: ModelRuntimeSettings | None, job: RuntimeSettings | None
                            ) -> tuple[tuple[str, ...], dict[str, str]]:
    """The model server's extra arguments and environment: the job's after (over)
    its model master's."""
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    for level in (master, job):
        if level is not None:
            args += level.args
            env.update(level.env)
    return args, env
