"""app-node's own SQLite file: a connection and one repository per aggregate
(see :mod:`._store` for the theory of operation and the tables)."""

from ..model import Page
from ._api_keys import ApiKeys
from ._connection import Connection
from ._invitations import Invitations
from ._job_records import KEPT_PAGE, JobRecords
from ._quotas import MAX_QUOTA_GPUS, Quotas
from ._read_cache import NotCached, ReadCache, cache_only
from ._rows import MAX_PAGE
from ._store import SCHEMA_VERSION, Store
from ._teams import Teams
from ._tokens import Tokens
from ._users import Users

__all__ = [
    "KEPT_PAGE",
    "MAX_PAGE",
    "MAX_QUOTA_GPUS",
    "SCHEMA_VERSION",
    "ApiKeys",
    "Connection",
    "Invitations",
    "JobRecords",
    "NotCached",
    "Page",
    "Quotas",
    "ReadCache",
    "Store",
    "Teams",
    "Tokens",
    "Users",
    "cache_only",
]
