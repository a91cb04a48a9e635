"""The HTTP endpoints: the Prometheus page and the health port, over one bounded server."""
