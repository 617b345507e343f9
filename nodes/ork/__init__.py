"""wrk-ork: racks and their capacity, placement, the job status machine, and the
RPC service app-node calls (DESIGN.md §4; nodes/README.md).

:mod:`.placement` decides where jobs go, :mod:`.status` what their status is,
:mod:`.orchestrator` keeps both (with :mod:`.store`) and says which operations
to publish; :mod:`.driver` and :mod:`.daemon` do the I/O; :mod:`.service` is
``cosmicac-ork/1``, whose callers :mod:`.access` gives roles (app-node, proxy).
"""
