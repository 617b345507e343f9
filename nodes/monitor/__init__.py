"""wrk-monitor: log records from every daemon and agent, followed live, pushed to Loki
(issue 14; not yet a daemon).

``_buffer`` is the sans-IO core (a bounded ring and followers with bounded
queues), ``service`` the ``cosmicac-monitor/1`` RPC service over it,
``shipper`` the sender side every daemon runs, and ``loki`` the push to and
history from the operator's Loki. The wire types are in
``contracts/telemetry.py``. Import-free: importing one part never loads the
others.
"""
