"""otel-numa: per-NUMA capacity, allocation and usage of a Kubernetes node, exported through OpenTelemetry."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("otel-numa")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"
