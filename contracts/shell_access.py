"""Who may open shells on a team's container jobs, kept live.

app-node is the truth of a team's members and their CLI keys. A GPU Container
Job's agent must follow it while the job runs: a removed member loses their
shell within seconds (open sessions closed), a member's new CLI key (a new
workstation, a new member) works on jobs that already run. The set travels
down the paths that already exist, each hop keeping the newest version it has
seen and ignoring anything older::

    app-node ──teams.set_shell_keys──▶ wrk-ork ──queue: set_shell_keys──▶ worker
        (cosmicac-ork/1, app-node only)     (per rack running the team's jobs)
    worker ◀──agent.shell_keys(version, wait_s)── agent-instance
        (cosmicac-agent/1: a long poll on the agent's report channel)

:class:`ShellKeys` is the one message of every hop: the team, its keys, and a
``version`` that only grows. A hop applies a set only if its version is above
the one it holds (a redelivery or a reordered older update changes nothing),
and persists it (wrk-ork's and the worker's SQLite, the agent's storage), so a
restart of any of them keeps the newest set. Healing: app-node re-sends every
team's set after it (re)starts and whenever its computed set differs from what
it sent; the worker renders the newest set into a (re)created agent's config;
an agent asks on every connection to its worker (``version`` 0 at first).

``agent.shell_keys`` (params :class:`ShellKeysWait`, result :class:`ShellKeys`)
answers at once when the worker holds a set whose version differs from the
caller's, else when one arrives or after ``wait_s``, with the current set. An
agent with an older worker (``UNKNOWN_METHOD``) keeps the keys of its config.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from p2p.rpc import Method

from .model import KeyHex

__all__ = [
    "MAX_SHELL_KEYS",
    "MAX_WAIT_S",
    "SHELL_KEYS",
    "ShellKeys",
    "ShellKeysAck",
    "ShellKeysWait",
    "TeamId",
]

#: Keys in one set: JobSpec.authorized_keys' bound (one CLI key per member).
MAX_SHELL_KEYS = 1024
#: Longest long poll an agent may ask for; its call timeout is this plus a margin.
MAX_WAIT_S = 60.0

#: A team id as wrk-ork knows it (JobSpec.team).
TeamId = Annotated[str, Field(min_length=1, max_length=64,
                              pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]


class ShellKeys(BaseModel):
    """A team's shell keys at one version (every hop's message)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    team: TeamId
    #: The CLI public keys of the team's members (sorted, unique).
    keys: tuple[KeyHex, ...] = Field(default=(), max_length=MAX_SHELL_KEYS)
    #: Grows with every change; 0 is "as the job was created" (its spec's keys).
    version: int = Field(ge=0, lt=2**63)

    def normalised(self) -> ShellKeys:
        """The same set with its keys sorted and unique (compare sets by ``keys``)."""
        return self.model_copy(update={"keys": tuple(sorted(set(self.keys)))})


class ShellKeysAck(BaseModel):
    """What wrk-ork holds for the team after ``teams.set_shell_keys``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The version wrk-ork holds now (the caller's, or a newer one it had).
    version: int = Field(ge=0)
    #: False: the given version was not above wrk-ork's (stale or a repeat).
    applied: bool


class ShellKeysWait(BaseModel):
    """An agent's long poll: answer when your set's version is not ``version``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The version the agent holds (0: only its config's keys).
    version: int = Field(default=0, ge=0, lt=2**63)
    #: How long the worker may hold the answer when nothing changed.
    wait_s: float = Field(default=20.0, ge=0, le=MAX_WAIT_S)


#: ``cosmicac-agent/1``: the shell keys of the caller's job's team (a long poll).
SHELL_KEYS = Method("agent.shell_keys", params=ShellKeysWait, result=ShellKeys)
