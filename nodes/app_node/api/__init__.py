"""app-node's HTTP API under ``/api``: auth and passwords, users, teams and
roles, invitations, API keys, model masters, jobs, racks and nodes.

``create_app(services)`` gives the ASGI app; see README.md for the routes.
"""

from ..codes import STATUS
from ._app import ROUTES, create_app, openapi
from ._body import BodyLimits
from ._common import ApiError

__all__ = ["ROUTES", "STATUS", "ApiError", "BodyLimits", "create_app", "openapi"]
