"""The runtime every daemon process shares, the platform's daemons in ``nodes/``
and the agents in a job's VM alike: process supervision (:mod:`.process`) and
shipping log records to wrk-monitor (:mod:`.log_shipper`).

It sits above ``p2p`` and ``contracts`` and below both ``nodes`` and
``agents``, which never import each other (DESIGN.md §1).
"""
