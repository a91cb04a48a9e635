"""Guards for every use of a dependency's private attributes (otel_numa/sdk_private.py): each fails when an
upgrade changes the shape the agent relies on, and the pins in pyproject.toml match what is installed."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_numa.sdk_private import DepartedSeriesJanitor
from otel_numa.testing.peers import REPO

PINNED = (
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-prometheus",
    "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry-exporter-otlp-proto-http",
    "prometheus-client",
)


def test_pins_are_compatible_release_pins_matching_the_installed_versions() -> None:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for package in PINNED:
        spec = next(d for d in dependencies if re.split(r"[~<>=]", d)[0] == package)
        match = re.fullmatch(rf"{package}~=(\d+)\.(\d+)\.?(\w*)", spec)
        assert match, f"{spec}: pin with ~= to a minor version"
        major, minor = match.group(1), match.group(2)
        assert re.match(rf"{major}\.{minor}(\.|b)", version(package)), (package, version(package))


def test_the_janitor_finds_the_sdk_shape_it_needs_and_forgets_only_departed_pods() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("guard")
    pods = {"alive", "gone"}
    meter.create_observable_gauge(
        "g", callbacks=[lambda _options: [_observation(uid) for uid in sorted(pods)]]
    )
    reader.collect()
    janitor = DepartedSeriesJanitor(provider)
    assert janitor.supported
    pods.discard("gone")
    assert janitor.forget({"alive"}.__contains__) == 1
    assert janitor.supported
    provider.shutdown()


def _observation(uid: str) -> Observation:
    return Observation(1, {"k8s.pod.uid": uid})
