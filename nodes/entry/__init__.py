"""The entry point: the user's door on ``127.0.0.1:5173`` (Caddy's place in the seeds).

``/api`` → app-node, ``/inference`` → proxy-inference (the OpenAI base URL is
``<entry>/inference/v1``), ``/monitor`` → wrk-monitor, any other path a page
linking the API docs. See README.md.
"""

from .app import BodyTooLarge, EntryApp
from .daemon import RunningEntry, open_client, serve_entry, start_entry
from .metrics import EntryMetrics
from .routes import Forward, Service, error_body, request_headers, response_headers, route
from .settings import API_URL, ENTRY_PORT, INFERENCE_URL, EntrySettings, parse_upstream_url

__all__ = [
    "API_URL",
    "ENTRY_PORT",
    "INFERENCE_URL",
    "BodyTooLarge",
    "EntryApp",
    "EntryMetrics",
    "EntrySettings",
    "Forward",
    "RunningEntry",
    "Service",
    "error_body",
    "open_client",
    "parse_upstream_url",
    "request_headers",
    "response_headers",
    "route",
    "serve_entry",
    "start_entry",
]
