"""What the platform's daemons and agents agree on (DESIGN.md §4).

The worker renders an agent's config and serves the agents' reports; the agent
parses that config and makes those reports; wrk-ork, the worker, the render
command and the agents all speak of jobs, racks and statuses. Those shared
contracts live here, below both ``nodes`` and ``agents``, so neither imports
the other: ``p2p`` ← ``contracts`` ← ``nodes``, ``agents`` ← ``cli``.

- :mod:`.model`: jobs, racks, nodes, placements, statuses;
- :mod:`.agent_config`: the agent's config (cloud-init user data / a file);
- :mod:`.agent_report`: the ``cosmicac-agent/1`` protocol (hello, ready,
  failed, heartbeat);
- :mod:`.telemetry`: the ``cosmicac-monitor/1`` protocol (log records);
- :mod:`.log_shipper`: its sender side, which every daemon and agent runs;
- :mod:`.health`: the ``service.status`` method app-node probes services with.
"""
