"""wrk-monitor: log records from every daemon and agent, followed live, pushed to Loki
(``cosmicac run wrk-monitor``).

``_buffer`` is the sans-IO core (a bounded ring and followers with bounded
queues), ``service`` the ``cosmicac-monitor/1`` RPC service over it, and
``loki`` the push to and history from the operator's Loki. The wire types are
in ``contracts/telemetry.py``; the sender side every daemon and agent runs is
``contracts/log_shipper.py`` (below both ``nodes`` and ``agents``).
Import-free: importing one part never loads the others.
"""
