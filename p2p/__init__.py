"""The CosmicAC peer-to-peer stack: identities, secret streams, channels and RPC.

Nothing in this package imports from the platform (``nodes``, ``agents``, ``cli``).
"""
