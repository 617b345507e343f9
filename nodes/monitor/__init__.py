"""wrk-monitor: log records from every daemon and agent, followed live, pushed to Loki
(``cosmicac run wrk-monitor``).

``_buffer`` is the sans-IO core (a bounded ring and followers with bounded
queues), ``service`` the ``cosmicac-monitor/1`` RPC service over it, and
``loki`` the push to and history from the operator's Loki. The protocol is
``contracts/monitor.py``; the sender side every daemon and agent runs is
``runtime/log_shipper.py``.
Import-free: importing one part never loads the others.
"""
