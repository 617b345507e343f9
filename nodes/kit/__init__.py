"""The shared daemon runtime: what every daemon in ``nodes/`` (and the agents) build on,
one module per job, imported by its own name (``nodes.kit.process``, ``nodes.kit.sqlite``...)."""
