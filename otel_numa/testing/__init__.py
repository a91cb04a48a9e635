"""Test support: tree generators, test servers and real peers for the tests and benchmarks (not shipped)."""
