"""proxy-inference: the OpenAI-compatible front of Managed Inference (DESIGN.md §4).

See ``nodes/README.md`` ("proxy-inference") for what it serves and how it is
configured. The parts:

- :mod:`.app`: the HTTP front (Starlette on hypercorn's trio worker);
- :mod:`.keys`: API keys in memory, refreshed when the database changes;
- :mod:`.router`: the routing table, a pure function of wrk-ork's jobs;
- :mod:`.replicas`: round robin over healthy replicas, with back-off (I/O-free);
- :mod:`.upstream`: the agents' connections and one retry per request;
- :mod:`.usage`: exact usage sums, appended to the shared database in batches;
- :mod:`.jobs`: wrk-ork followed over the swarm (or jobs given by hand);
- :mod:`.daemon`: :func:`serve_proxy` (in-process) and :func:`start_proxy`.
"""

from .daemon import RunningProxy, serve_proxy, start_proxy
from .jobs import JobSource, OrkJobSource, StaticJobSource
from .settings import HTTP_PORT, PROXY_PORT, ProxySettings

__all__ = [
    "HTTP_PORT",
    "PROXY_PORT",
    "JobSource",
    "OrkJobSource",
    "ProxySettings",
    "RunningProxy",
    "StaticJobSource",
    "serve_proxy",
    "start_proxy",
]
