"""The UI's defences that need no I/O: which requests may change something, and the
headers every answer carries.

Cross-site request forgery: a form on another site can make the browser POST
here with the user's cookie. ``SameSite=Strict`` already keeps the cookie off
such requests in current browsers; this check refuses them anyway, by what the
browser says of the request's origin (``Sec-Fetch-Site``, sent by every current
browser; else ``Origin`` against the host the browser addressed). A request with
neither is refused too: only a browser posts to the UI, and the API is the
place for scripts.

The Content-Security-Policy allows scripts, styles and connections from this
origin only, no inline script and no framing: an injected ``<script>`` in a job
name or a log line would not run even if escaping failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["SAFE_METHODS", "SECURITY_HEADERS", "cross_site_reason", "request_is_https"]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("content-security-policy",
     "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     "connect-src 'self'; worker-src 'self'; form-action 'self'; frame-ancestors 'none'; "
     "base-uri 'none'"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "same-origin"),
    ("cross-origin-opener-policy", "same-origin"),
)


def cross_site_reason(method: str, headers: Mapping[str, str], host: str) -> str | None:
    """Why a request must be refused as cross-site, or None if it may go on.

    ``headers``: lower-case names. ``host``: the host (and port) the browser
    addressed (``X-Forwarded-Host`` behind the entry point, else ``Host``).
    """
    if method.upper() in SAFE_METHODS:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None:
        if site in ("same-origin", "none"):
            return None
        return f"the request came from another site (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return "the browser did not say where the request came from (no Origin)"
    if urlsplit(origin).netloc.lower() != host.lower():
        return f"the request came from {origin}, not from this site"
    return None


def request_is_https(scheme: str, headers: Mapping[str, str]) -> bool:
    """Did the browser use HTTPS (here, or to the proxy in front: ``X-Forwarded-Proto``)?"""
    forwarded = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return scheme == "https" or forwarded == "https"
