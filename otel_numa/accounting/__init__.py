"""Pure functions from the sources' values to per-NUMA and per-container quantities."""
