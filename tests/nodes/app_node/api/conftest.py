"""The API tests' fixtures (``api``, ``ork_api``, ``logs_api``, ``tenants``), defined
with what they build in ``apis.py``."""

from .apis import api, logs_api, ork_api, tenants  # noqa: F401
