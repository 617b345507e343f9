"""app-node: the HTTP API under /api, its users, teams, tokens and job records."""
