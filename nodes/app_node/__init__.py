"""app-node: the platform's HTTP API, its rate limits and its auth primitives (DESIGN.md §4)."""
