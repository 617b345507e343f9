"""A lean HTTP/1.1 server for ASGI apps: ``httptools`` (llhttp) under trio.

For the hot HTTP fronts (proxy-inference's OpenAI API, the agents' model
servers), where hypercorn's pure-Python h11 parsing and its task per request
cost more than the request itself. :mod:`p2p.http`'s ``serve_asgi(...,
lean=True)`` serves an app with it; every other endpoint stays on hypercorn.

- ``_core.py``: :class:`ServerConnection`, the sans-IO connection (bytes in,
  request events out; answers to bytes);
- ``_server.py``: the trio driver and the ASGI adapter (:func:`serve_listener`,
  :func:`serve_connection`, :class:`ServerConfig`);
- ``_errors.py``: the exception tree.
"""

from ._core import Body, EndOfRequest, Event, RequestHead, ServerConnection
from ._errors import HttpServerError, LocalProtocolError, RemoteProtocolError
from ._server import ServerConfig, serve_connection, serve_listener

__all__ = [
    "Body",
    "EndOfRequest",
    "Event",
    "HttpServerError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "RequestHead",
    "ServerConfig",
    "ServerConnection",
    "serve_connection",
    "serve_listener",
]
