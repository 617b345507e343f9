"""The shared daemon runtime: what every daemon of ``nodes/`` runs, below them all.

Daemons meet only over the swarm, through ``contracts/``; what they share in
process lives here, and no module here imports a daemon package:

- :mod:`.settings`: the settings every daemon shares (``PeerSettings``: its
  folder and its swarm; ``HttpSettings``: its HTTP side; ``PeerRef``: a
  daemon it dials);
- :mod:`.peer`: the one way to start a daemon's peer (``start_peer``) and its
  HTTP side (``serve_http``), each port that cannot be bound named in one line;
- :mod:`.peer_client`: one long-lived RPC client of another daemon, and the
  typed clients over the contracts: :mod:`.ork_client` (``cosmicac-ork/1``,
  app-node's) and :mod:`.monitor_client` (``cosmicac-monitor/1``, app-node's
  reader);
- :mod:`.reporter`: a task that pushes the latest snapshot of something to
  wrk-monitor every few seconds (the proxies' windows, the workers' agents);
- :mod:`.telemetry` and :mod:`.log_shipper`: a daemon's (or an agent's) log
  records shipped to wrk-monitor;
- :mod:`.metrics`: Prometheus exposition helpers;
- :mod:`.forwarded`: the client address behind trusted HTTP proxies;
- :mod:`.process`: spawn a child in its own group, stop it (TERM, then KILL),
  describe its exit;
- :mod:`.sqlite`: a store's connection (WAL), its migration ladder and its
  immediate transactions;
- :mod:`.ready`: the one ready line every daemon prints, and its parser.

Import-free: importing one part never loads the others.
"""
