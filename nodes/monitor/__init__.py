"""wrk-monitor: log records from every daemon and agent, followed live, pushed to Loki.

``_buffer`` is the sans-IO core (a bounded ring and followers with bounded
queues), ``service`` the ``cosmicac-monitor/1`` RPC service over it, and
``shipper`` the sender side every daemon runs. The wire types are in
``contracts/telemetry.py``. Deliberately import-free, so that modules added
beside these (``loki``) merge without touching this file.
"""
