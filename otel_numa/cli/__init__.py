"""The command line: flags, environment and YAML (pydantic-settings), logging, then the daemon."""
