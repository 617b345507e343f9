"""wrk-server-k8s-nvidia: takes wrk-ork's operations off the durable queue, runs
them on a backend (``kubevirt`` or ``local``), and reports replica states and the
rack's capacity back (DESIGN.md §4; nodes/README.md).

:mod:`.worker` applies operations and reconciles, :mod:`.replica_state` derives
a replica's state from its VMIs and agents, :mod:`.agents` serves the agents'
reports, :mod:`.backend` is the interface both backends implement.
"""
