"""The CosmicAC platform daemons (DESIGN.md §4), one package each: wrk-ork (``ork``),
wrk-server-k8s-nvidia (``k8s_worker``), app-node (``app_node``), proxy-inference
(``proxy_inference``), wrk-monitor (``monitor``) and the entry point (``entry``).

The daemons meet over the swarm through :mod:`contracts` (the shared vocabulary of
jobs, racks, placements and statuses is :mod:`contracts.model`); what they share at
run time (the RPC client of a peer, telemetry, metrics) lives beside their packages.
"""
