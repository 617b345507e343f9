"""The in-VM job agents (DESIGN.md §4): one process per VMI that joins the
swarm with its job's relays and reports to the worker that started it.

:mod:`contracts.agent_config` is the one config model the worker renders (into
cloud-init user data, or a file for the ``local`` backend) and the agent
parses.
"""
