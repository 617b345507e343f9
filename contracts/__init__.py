"""What the platform's daemons and agents agree on: one module per protocol (DESIGN.md §1, §4).

Daemons meet only over the swarm, and agents only through their worker; what
they say to each other is drawn here, below ``nodes`` and ``agents``, so that
no daemon imports another and neither side imports the other:
``p2p`` ← ``contracts`` ← ``nodes.kit`` ← each daemon, ``agents`` ← ``cli``.
This package imports only ``p2p``, pydantic, msgpack (the wire codec) and the
standard library (``tests/test_layering.py``). Each protocol module draws its
methods with their names and error codes, its params, results and views
(pydantic models that forbid unknown fields) and its version (in the protocol
name, e.g. ``cosmicac-ork/1``).

- :mod:`.model`: jobs, racks, nodes, placements, statuses;
- :mod:`.runtime_settings`: a model server's extra arguments, environment and
  hub token Secret, as a model master and a job give them;
- :mod:`.ork`: ``cosmicac-ork/1``, wrk-ork's API (jobs, replicas, racks,
  nodes, the job watch) for app-node and proxy-inference;
- :mod:`.operations`: what wrk-ork and the worker say over the durable queue
  (operations one way, reports the other);
- :mod:`.monitor`: ``cosmicac-monitor/1``, wrk-monitor's API (log records
  pushed, followed and queried; the proxies' and agents' metrics; model
  health; observability settings; its status details);
- :mod:`.agent_config`: the agent's config (cloud-init user data / a file);
- :mod:`.agent_report`: the ``cosmicac-agent/1`` protocol (hello, ready,
  failed, heartbeat, logs);
- :mod:`.inference`: ``cosmicac-inference/1``, proxy-inference to the agents;
- :mod:`.shell_access`: a team's shell keys, as they travel to the agents;
- :mod:`.health`: the ``service.status`` method app-node probes services with.

The sender side of ``cosmicac-monitor/1`` (the log shipper) and the typed
clients over these protocols are runtime, not contract: ``nodes/kit/``.
"""
