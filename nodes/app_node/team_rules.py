"""Operators' rules for teams: who may create one, and the GPU quotas a new team gets.

``COSMICAC_APP_NODE__TEAMS__CREATORS`` (``operators``, the default, or
``everyone``), ``…__TEAMS__DEFAULT_GPUS`` and ``…__TEAMS__DEFAULT_PER_USER_GPUS``
(unset, the default: a new team has no quota, i.e. unlimited). The defaults are
copied into a team when it is created through ``POST /api/teams``; changing
them later changes no existing team (set those with ``cosmicac teams quota
set``). The first admin's team, made at sign-up, starts without a quota.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from .model import TeamQuota
from .store import MAX_QUOTA_GPUS

__all__ = ["TeamCreators", "TeamsSettings"]


class TeamCreators(StrEnum):
    """Who may create a team (``POST /api/teams``)."""

    #: The platform operators only (owners and admins of the first admin's team).
    OPERATORS = "operators"
    #: Any signed-in user (they own the team they create).
    EVERYONE = "everyone"


class TeamsSettings(BaseModel):
    """app-node's ``teams`` settings (see the module)."""

    model_config = {"extra": "forbid", "frozen": True}

    creators: TeamCreators = TeamCreators.OPERATORS
    #: GPUs a new team's jobs may hold or wait for (all replicas); None: unlimited.
    default_gpus: int | None = Field(default=None, ge=0, le=MAX_QUOTA_GPUS)
    #: The same for each member's own jobs in a new team; None: unlimited.
    default_per_user_gpus: int | None = Field(default=None, ge=0, le=MAX_QUOTA_GPUS)

    def default_quota(self) -> TeamQuota | None:
        """What a new team starts with; None when both are unset."""
        if self.default_gpus is None and self.default_per_user_gpus is None:
            return None
        return TeamQuota(gpus=self.default_gpus, per_user_gpus=self.default_per_user_gpus)
