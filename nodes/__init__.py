"""The CosmicAC platform daemons (DESIGN.md §1, §4), one package each: ``ork``
(wrk-ork), ``k8s_worker`` (wrk-server-k8s-nvidia), ``app_node``,
``proxy_inference``, ``monitor`` (wrk-monitor) and ``entry``.

No daemon package imports another: daemons meet over the swarm, through the
protocols in :mod:`contracts`. What they share in process is the daemon
runtime in :mod:`nodes.kit`, below them all (``tests/test_layering.py``).
"""
