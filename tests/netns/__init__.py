"""Integration tests across Linux network namespaces (see README.md here)."""
