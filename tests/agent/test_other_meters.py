"""Another MeterProvider in the same process behaves exactly as without the agent: a program that builds an
agent pipeline (accelerated path on, scraped and pushed) and has meters of its own sees the same points and
pages from its own provider as the same program without the agent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from otel_numa.testing.large_node import LargeNodeSpec, write_large_node

PROGRAM = """
import json, sys
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import Counter, MeterProvider, ObservableCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

def library_functions():
    # every module global and class attribute of the OpenTelemetry and prometheus_client modules loaded
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("opentelemetry", "prometheus_client")):
            continue
        for attribute, value in list(vars(module).items()):
            found[(name, attribute)] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for member, inner in list(vars(value).items()):
                    found[(name, attribute, member)] = id(inner)
    return found

if sys.argv[1] == "with-agent":
    import opentelemetry.exporter.otlp.proto.grpc.metric_exporter
    import opentelemetry.exporter.otlp.proto.http.metric_exporter
    import prometheus_client.openmetrics.exposition
    from otel_numa.daemon.agent import Agent
    from otel_numa.cli.settings import Settings
    from otel_numa.export.pipeline import build_pipeline
    from otel_numa.testing.wsgi import call_wsgi
    agent = Agent(Settings(**json.loads(sys.argv[2])).to_options())
    agent.refresh_background()
    before = library_functions()
    pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus", "console"))
    assert pipeline.fast_path, pipeline.fast_path
    app = pipeline.page_app()
    for accept in ("", "application/openmetrics-text; version=1.0.0"):
        for _ in range(2):
            assert b"numa_cpu_capacity" in call_wsgi(app, accept=accept)[2]
    pipeline.push()  # the console exporter's output comes before the program's last line
    after = library_functions()
    changed = sorted(str(key) for key in before if key in after and after[key] != before[key])
    assert not changed, changed  # nothing of the libraries was replaced for the whole process

state = {"pods": ["a", "b", "c"], "value": 1}
def observe(_options):
    pods = enumerate(state["pods"])
    return [Observation(state["value"] * i, {"k8s.pod.uid": uid, "n": i}) for i, uid in pods]

registry = CollectorRegistry(auto_describe=False)
cumulative = InMemoryMetricReader()
delta = InMemoryMetricReader(preferred_temporality={
    Counter: AggregationTemporality.DELTA, ObservableCounter: AggregationTemporality.DELTA})
page = PrometheusMetricReader(registry=registry)
resource = Resource.create({"service.name": "x", "service.instance.id": "i"})
provider = MeterProvider(metric_readers=[cumulative, delta, page], resource=resource)
meter = provider.get_meter("someone-else")
meter.create_observable_gauge("g", callbacks=[observe])
meter.create_observable_counter("c", callbacks=[observe])
counter = meter.create_counter("requests")
histogram = meter.create_histogram("latency")
client_registry = CollectorRegistry()
client_gauge = Gauge("client_gauge", "a prometheus_client gauge", ["pod"], registry=client_registry)

out = []
for round_ in range(4):
    state["value"] = round_ + 1
    if round_ == 2:
        state["pods"] = ["a", "c", "d"]
    attrs = {"route": "/x", "n": round_ % 2}
    counter.add(round_ + 1, attrs)
    histogram.record(round_ * 1.5, attrs)
    client_gauge.labels(pod=str(round_)).set(round_)
    for reader in (cumulative, delta):
        data = reader.get_metrics_data()
        points = []
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        fields = {k: v for k, v in json.loads(p.to_json()).items()
                                  if k not in ("time_unix_nano", "start_time_unix_nano")}
                        points.append([m.name, fields])
        out.append(sorted(points, key=json.dumps))
    out.append(generate_latest(registry).decode())
    out.append(openmetrics_latest(registry).decode())
    out.append(generate_latest(client_registry).decode())
print(json.dumps(out))
"""


def run(*args: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.splitlines()[-1]


def test_another_meter_provider_in_the_process_is_untouched_by_the_agent(tmp_path: Path) -> None:
    import json

    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=4, pods=3, containers_per_pod=1, devices_per_resource=1)
    node = write_large_node(tmp_path, spec)
    values = {key: str(value) for key, value in node.settings_values().items()}
    alone, beside_the_agent = run("alone"), run("with-agent", json.dumps(values))
    assert '"k8s.pod.uid": "d"' in alone and "client_gauge" in alone
    assert beside_the_agent == alone
