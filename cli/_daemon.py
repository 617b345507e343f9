"""Running a long-lived command until SIGINT/SIGTERM: the kit's helper."""

from __future__ import annotations

from p2p.daemon import run_until_signalled

__all__ = ["run_until_signalled"]
