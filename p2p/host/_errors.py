"""The host's errors.

::

    P2PError
    └── HostError            a connection could not be taken on (.code says why)
"""

from __future__ import annotations

from ..errors import P2PError

__all__ = ["HostError"]


class HostError(P2PError):
    """The host refused a connection or a service.

    Codes: ``REFUSED`` (a limit or the firewall), ``SELF`` (our own key),
    ``DUPLICATE_SERVICE`` (a protocol served twice), ``NOT_RUNNING``.
    """

    code = "HOST_ERROR"
