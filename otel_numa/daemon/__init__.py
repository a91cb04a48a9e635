"""The long-running process: the agent's rounds, its scheduler, its heap policy and serving entry."""
