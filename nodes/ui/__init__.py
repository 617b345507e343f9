"""The web UI: server-rendered pages for the people who use the platform day to day.

An ASGI app of its own (``cosmicac run ui``), served by the entry point for every
path other than ``/api``, ``/inference`` and ``/monitor``. It speaks to app-node
only through the public ``/api`` with the signed-in user's bearer token, which it
keeps server-side (:mod:`.sessions`); the browser holds an ``HttpOnly`` cookie. So
the UI can do nothing the API and the CLI cannot.

Modules: :mod:`.settings`, :mod:`.sessions` (who is signed in), :mod:`.guard`
(same-origin check and security headers, sans-IO), :mod:`.api` (the client of
``/api``), :mod:`.views` (status names, forms' errors), :mod:`.app` (routes and
templates), :mod:`.daemon`. See README.md.
"""
