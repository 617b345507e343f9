"""What app-node's HTTP routes are given to work with: one object the daemon builds.

The routes (``nodes/app_node/api/``) never open files, sockets or clocks
themselves: the daemon (``daemon.py``) builds an :class:`AppServices` from its
settings and hands it to ``create_app``; tests build one from in-memory parts
(a store on ``:memory:``-like temp files, a database replica, an outbox
sender, an embedded limiter, a fake clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from .team_rules import TeamsSettings

if TYPE_CHECKING:
    from crdt import Database
    from nodes.kit.monitor_client import MonitorClient
    from nodes.kit.ork_client import OrkClient

    from .email import EmailSender
    from .health import HealthProber
    from .job_events import JobHub
    from .job_projection import JobProjection
    from .ratelimit import Limiter, Limits
    from .store import Store

__all__ = ["AppServices", "Lifetimes", "SwarmAdvert"]


@dataclass(frozen=True)
class Lifetimes:
    """How long what app-node issues stays valid."""

    session: timedelta = timedelta(days=7)
    password_reset: timedelta = timedelta(hours=1)
    invitation: timedelta = timedelta(days=7)


@dataclass(frozen=True)
class SwarmAdvert:
    """How a user's machine joins the swarm (``GET /api/swarm``, for ``cosmicac shell``):
    DHT bootstrap ``host:port``, relay keys (hex) and where each relay listens, from
    app-node's settings."""

    bootstrap: tuple[str, ...] = ()
    relays: tuple[str, ...] = ()
    #: (relay key hex, its ``host:port`` addresses), for the relays that have some.
    relay_addresses: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass
class AppServices:
    """Everything the routes use.

    Attributes:
        store: app-node's own SQLite (blocking: call it through ``trio.to_thread``).
        database: its replica of the shared database (API keys, model masters,
            usage); app-node created it and is its admin.
        ork: the client of wrk-ork for job, replica, rack and node operations;
            None until wrk-ork is configured (those routes answer 503).
        email: invitations and password resets.
        limiter / limits: the rate limits per token and per IP.
        public_url: the URL users reach (the entry point), for links in emails.
        default_image: the image of a job that names none; None: jobs must name one.
        swarm: what ``GET /api/swarm`` advertises.
        clock: POSIX seconds (tests pass a fake).
        events: wrk-ork's job status changes, fanned out to the event streams
            (``GET /api/jobs/{job}/events``); the daemon follows wrk-ork into it
            (:func:`~.job_events.follow_ork`). None: those routes answer 503.
        jobs: app-node's copy of wrk-ork's jobs, kept from the same watch
            (:mod:`.job_projection`): the job listing and pages read it while it
            is synced, and ask wrk-ork otherwise (or when it is None).
        monitor: the client of wrk-monitor for job logs (``GET /api/jobs/{job}/logs``);
            None until wrk-monitor is configured (that route answers 503).
        health: the control plane's health prober, whose store ``GET /api/health``
            reads; None when disabled (those routes answer 503).
        teams: who may create teams and the quotas a new team gets (settings
            ``teams.*``; default: operators only, no quota).
    """

    store: Store
    database: Database
    ork: OrkClient | None
    email: EmailSender
    limiter: Limiter
    limits: Limits
    public_url: str = "http://127.0.0.1:5173"
    default_image: str | None = None
    swarm: SwarmAdvert = field(default_factory=SwarmAdvert)
    lifetimes: Lifetimes = field(default_factory=Lifetimes)
    clock: Callable[[], float] = time.time
    events: JobHub | None = None
    jobs: JobProjection | None = None
    monitor: MonitorClient | None = None
    health: HealthProber | None = None
    teams: TeamsSettings = field(default_factory=TeamsSettings)
