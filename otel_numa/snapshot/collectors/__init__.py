"""Collectors turn sources into state for the snapshot, re-reading only what may have changed."""
