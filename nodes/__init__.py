"""The CosmicAC platform daemons: wrk-ork, wrk-server-k8s-nvidia and, later,
app-node, proxy-inference and wrk-monitor (DESIGN.md §4).

Shared vocabulary lives in :mod:`contracts.model` (jobs, racks, placements,
statuses) and :mod:`contracts.operations` (what wrk-ork and the worker say to each
other over the durable queue).
"""
