"""wrk-ork: racks and their capacity, placement, the job status machine, and the
RPC service app-node calls (DESIGN.md §4; nodes/README.md).

:mod:`.capacity` models the racks' GPUs and their claims, :mod:`.placement`
(functions over a capacity) decides where jobs go, :mod:`.status` what their
status is; :mod:`.orchestrator` decides what happens to jobs and says which
operations to publish, keeping its records in a :mod:`.job_book` (over
:mod:`.store`); :mod:`.driver` and :mod:`.daemon` do the I/O; :mod:`.service` is
``cosmicac-ork/1``, whose callers :mod:`.access` gives roles (app-node, proxy).
"""
