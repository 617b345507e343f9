"""app-node (DESIGN.md §4): the HTTP API under /api, its rate limits and auth,
its email, its users, teams, tokens and job records."""
