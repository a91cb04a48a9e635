"""The gateway stand-in (otel_numa/testing/gateway.py) translates OTLP into Prometheus series as the
Collector's Prometheus exporter does, and the gateway's transform/prometheus_names statements make those
names the agent's own page names: checked on the translator's documented cases and on every metric of the
agent's catalogue."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from prometheus_client.parser import text_string_to_metric_families

from otel_numa.instruments import catalogue
from otel_numa.testing.gateway import GatewaySettings, PrometheusPage, prometheus_metric_name


@pytest.mark.parametrize(
    ("name", "unit", "gauge", "monotonic", "expected"),
    [
        ("system.memory.utilization", "1", True, False, "system_memory_utilization_ratio"),
        ("numa.container.memory.locality", "1", True, False, "numa_container_memory_locality_ratio"),
        ("numa.node.count", "{node}", False, False, "numa_node_count"),
        ("system.filesystem.usage", "By", False, False, "system_filesystem_usage_bytes"),
        ("numa.cpu.time", "s", False, True, "numa_cpu_time_seconds_total"),
        ("numa.agent.source.errors", "{error}", False, True, "numa_agent_source_errors_total"),
        ("system.network.dropped", "packets", False, False, "system_network_dropped_packets"),
        ("http.server.duration", "ms", True, False, "http_server_duration_milliseconds"),
        ("network.io", "By/s", True, False, "network_io_bytes_per_second"),
        ("(lambda).function.executions(#)", "", True, False, "lambda_function_executions"),
        ("a.ratio.thing", "1", False, False, "a_ratio_thing"),  # not a gauge: no _ratio
    ],
)
def test_names_follow_the_translators_documented_cases(
    name: str, unit: str, gauge: bool, monotonic: bool, expected: str
) -> None:
    assert prometheus_metric_name(name, unit, gauge=gauge, monotonic=monotonic) == expected


def _collector_name(spec: catalogue.MetricSpec, unit: str) -> str:
    # the agent's up-down counters are non-monotonic cumulative sums, its gauges gauges
    return prometheus_metric_name(
        spec.name, unit, gauge=spec.kind == "gauge", monotonic=spec.kind == "counter"
    )


def test_only_the_unit_one_gauges_differ_without_the_gateways_statements() -> None:
    differing = {
        spec.prometheus_name: _collector_name(spec, spec.unit)
        for spec in catalogue.METRICS
        if _collector_name(spec, spec.unit) != spec.prometheus_name
    }
    unit_one_gauges = {
        spec.prometheus_name for spec in catalogue.METRICS if spec.unit == "1" and spec.kind == "gauge"
    }
    assert set(differing) == unit_one_gauges
    assert "numa_container_memory_locality" in differing
    assert all(pushed == f"{name}_ratio" for name, pushed in differing.items())


def test_with_the_gateways_statements_every_name_is_the_agents_page_name() -> None:
    for spec in catalogue.METRICS:
        if spec.name.startswith("numainfo_"):
            continue  # numainfo_exporter's names, already Prometheus names
        unit = "" if spec.unit == "1" else spec.unit
        assert _collector_name(spec, unit) == spec.prometheus_name, spec.name


def _request(node: str) -> metrics_service_pb2.ExportMetricsServiceRequest:
    def attribute(key: str, value: str | int) -> common_pb2.KeyValue:
        any_value = (
            common_pb2.AnyValue(int_value=value)
            if isinstance(value, int)
            else common_pb2.AnyValue(string_value=value)
        )
        return common_pb2.KeyValue(key=key, value=any_value)

    resource = resource_pb2.Resource(
        attributes=[
            attribute("service.name", "otel-numa"),
            attribute("service.instance.id", node),
            attribute("k8s.node.name", node),
            attribute("host.name", "host-a"),
        ]
    )
    aligned = metrics_pb2.Metric(
        name="numa.container.aligned",
        unit="1",
        description="1 when aligned",
        gauge=metrics_pb2.Gauge(
            data_points=[metrics_pb2.NumberDataPoint(as_int=1, attributes=[attribute("k8s.pod.uid", "u1")])]
        ),
    )
    free = metrics_pb2.Metric(
        name="numa.cpu.allocatable",
        unit="{cpu}",
        sum=metrics_pb2.Sum(
            is_monotonic=False,
            aggregation_temporality=metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE,
            data_points=[metrics_pb2.NumberDataPoint(as_int=31, attributes=[attribute("numa.node.id", 0)])],
        ),
    )
    scope = metrics_pb2.ScopeMetrics(
        scope=common_pb2.InstrumentationScope(name="otel-numa", version="1.0"), metrics=[aligned, free]
    )
    return metrics_service_pb2.ExportMetricsServiceRequest(
        resource_metrics=[metrics_pb2.ResourceMetrics(resource=resource, scope_metrics=[scope])]
    )


def _samples(settings: GatewaySettings) -> dict[str, list[dict[str, str]]]:
    page = PrometheusPage(settings)
    page.consume(_request("worker-1"))
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(page.render().decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(dict(sample.labels))
    return found


def test_the_charts_gateway_serves_the_agents_names_with_the_node_label() -> None:
    samples = _samples(GatewaySettings())
    (aligned,) = samples["numa_container_aligned"]
    assert aligned["k8s_node_name"] == "worker-1"
    assert aligned["job"] == "otel-numa" and aligned["instance"] == "worker-1"
    assert aligned["otel_scope_name"] == "otel-numa"
    assert aligned["host_name"] == "host-a"  # resource_to_telemetry_conversion: every resource attribute
    (allocatable,) = samples["numa_cpu_allocatable"]
    assert allocatable["numa_node_id"] == "0" and allocatable["k8s_node_name"] == "worker-1"
    (target,) = samples["target_info"]
    assert target == {
        "job": "otel-numa",
        "instance": "worker-1",
        "k8s_node_name": "worker-1",
        "host_name": "host-a",
    }


def test_a_bare_gateway_renames_unit_one_gauges_and_keeps_the_node_in_target_info() -> None:
    samples = _samples(GatewaySettings(resource_to_telemetry_conversion=False, prometheus_names=False))
    assert "numa_container_aligned" not in samples
    (aligned,) = samples["numa_container_aligned_ratio"]
    assert "k8s_node_name" not in aligned and aligned["instance"] == "worker-1"
    assert samples["target_info"][0]["k8s_node_name"] == "worker-1"


def test_the_statements_alone_copy_only_the_node_name() -> None:
    samples = _samples(GatewaySettings(resource_to_telemetry_conversion=False))
    (aligned,) = samples["numa_container_aligned"]
    assert aligned["k8s_node_name"] == "worker-1" and "host_name" not in aligned
