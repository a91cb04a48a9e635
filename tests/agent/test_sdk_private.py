"""Guards for every use of a dependency's private attributes (otel_numa/sdk_private.py): each fails when an
upgrade changes the shape the agent relies on, and the pins in pyproject.toml match what is installed."""

from __future__ import annotations

import gc
import re
import shutil
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
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


def small_node(root: Path, **settings: Any) -> tuple[Any, Any]:
    """A 2-node LargeNode with 6 pods of 2 containers under ``root``, and an Agent reading it."""
    from otel_numa.cli.settings import Settings
    from otel_numa.daemon.agent import Agent
    from otel_numa.testing.large_node import LargeNodeSpec, write_large_node

    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=8, pods=6, containers_per_pod=2, devices_per_resource=2)
    node = write_large_node(root, spec)
    return node, Agent(Settings(**node.settings_values(), **settings).to_options())  # type: ignore[arg-type]


def generations(node: Any, agent: Any) -> Iterator[int]:
    """Five states of ``node``, each read by ``agent`` before it is yielded: 0 and 1 the same, 2 and 3 new
    cgroup values for the same series, 4 one pod fewer."""
    for generation in range(5):
        if generation in (2, 3):
            node.write_cgroup_usage(generation)
        if generation == 4:
            shutil.rmtree(next((node.root / "pod-logs").iterdir()))
        agent.refresh_background()
        yield generation


def calls_to(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[tuple[Any, ...]]:
    """Wraps ``owner.name`` for the test: the wrapped function still runs; the list gets each call's
    arguments."""
    calls: list[tuple[Any, ...]] = []
    original = getattr(owner, name)

    def recorded(*args: Any) -> Any:
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(owner, name, recorded)
    return calls


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
    assert janitor.forget(frozenset({"alive"})) == 1
    assert janitor.forget(frozenset({"alive"})) == 0
    pods.add("late")  # a series of a pod that is not live, made after the last forgetting
    reader.collect()
    assert janitor.forget(frozenset({"alive"})) == 1
    pods.discard("late")
    assert janitor.forget(frozenset()) == 1  # other live pods: everything is looked at again
    assert janitor.supported
    provider.shutdown()


def _observation(uid: str) -> Observation:
    return Observation(1, {"k8s.pod.uid": uid})


def test_every_fast_path_is_installed_on_the_pinned_versions() -> None:
    import prometheus_client.exposition as exposition

    from otel_numa.sdk_private import FAST_PATHS, RenderedFamilies, install_family_rendering

    FAST_PATHS.install()
    assert sorted(FAST_PATHS.installed) == [
        "opentelemetry.exporter.prometheus.sanitize_attribute",
        "opentelemetry.sdk.metrics._internal._view_instrument_match._ViewInstrumentMatch.collect",
        "opentelemetry.sdk.metrics._internal._view_instrument_match._ViewInstrumentMatch.consume_measurement",
        "opentelemetry.sdk.metrics._internal._view_instrument_match._hash_attributes",
        "opentelemetry.sdk.metrics._internal.instrument._Asynchronous.callback",
        "opentelemetry.sdk.metrics._internal.measurement._clean_attribute_value",
        "prometheus_client.openmetrics.exposition.escape_label_name",
    ]
    assert isinstance(install_family_rendering(), RenderedFamilies)
    assert isinstance(getattr(exposition.generate_latest, "__self__", None), RenderedFamilies)


def test_the_page_is_byte_for_byte_what_the_libraries_write(
    hwloc_root: Callable[[str], tuple[Path, Path]],
) -> None:
    """Scrapes through every fast path (reused translations and text from the second scrape on) give the
    same bytes as prometheus_client's own encoders, in both formats, also after an input changed."""
    import prometheus_client.exposition as exposition
    import prometheus_client.openmetrics.exposition as openmetrics

    from otel_numa.cli.settings import Settings
    from otel_numa.daemon.agent import Agent
    from otel_numa.instruments.catalogue import MetricGroup
    from otel_numa.pipeline import build_pipeline
    from otel_numa.sdk_private import RenderedFamilies

    sysfs, procfs = hwloc_root("16amd64-4n4c-cgroup-distance-merge")
    settings = Settings(
        sysfs_root=sysfs,
        procfs_root=procfs,
        podresources_socket="none",
        disable=frozenset({MetricGroup.HEALTH}),
        node_name="n",
    )
    agent = Agent(settings.to_options())
    pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    rendered = getattr(exposition.generate_latest, "__self__", None)
    assert isinstance(rendered, RenderedFamilies) and pipeline.registry is not None
    pages = []
    for round_ in range(3):
        if round_ == 2:  # one value changes: that family is translated and rendered again
            meminfo = sysfs / "devices/system/node/node1/meminfo"
            meminfo.write_text(re.sub(r"(MemFree:\s+)\d+", r"\g<1>4096", meminfo.read_text()))
        page = exposition.generate_latest(pipeline.registry)
        assert page == rendered.text_encoder(pipeline.registry)
        assert b"numa_cpu_capacity" in page
        pages.append(page)
        om = openmetrics.generate_latest(pipeline.registry)  # type: ignore[no-untyped-call]
        assert om == rendered.openmetrics_encoder(pipeline.registry) and om.endswith(b"# EOF\n")
    assert pages[0] == pages[1] != pages[2]
    pipeline.shutdown(timeout_s=1)


def test_reused_translations_equal_the_exporters_own(tmp_path: Path) -> None:
    """One MeterProvider, two Prometheus readers over the agent's instruments: one with reused
    translations, one as the exporter ships it. Their pages are equal while values change (fresh
    per-container usage: a family with the same series is not translated again, and its samples are made
    from its recipe when read) and while series come and go."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, generate_latest

    from otel_numa.instruments import register_instruments
    from otel_numa.instruments.catalogue import METRICS

    node, agent = small_node(tmp_path / "node")
    fast_registry, plain_registry = CollectorRegistry(), CollectorRegistry()
    fast = PrometheusMetricReader(registry=fast_registry, disable_target_info=True)
    plain = PrometheusMetricReader(registry=plain_registry, disable_target_info=True)
    translated = record_translations(fast)
    provider = MeterProvider(metric_readers=[fast, plain])
    names = [spec.name for spec in METRICS if spec.group.value not in ("health", "compat")]
    register_instruments(provider.get_meter("t"), agent.store, names, "n")
    pages = []
    usage = {"numa.container.memory.usage", "numa.container.cpu.time"}
    for generation in generations(node, agent):
        translated.clear()
        with agent.store.pinned():
            fast_page, plain_page = generate_latest(fast_registry), generate_latest(plain_registry)
        assert fast_page == plain_page, generation
        assert b"numa_container_memory_usage_bytes" in fast_page
        pages.append(fast_page)
        if generation == 0:  # new series: translated
            assert usage <= set(translated)
        elif generation == 4:  # a pod fewer in the families that show it
            assert "numa.container.memory.allocated" in translated, translated
        else:  # the same series, with the same or new values
            assert not usage & set(translated), generation
    assert (
        pages[0] == pages[1] != pages[2] != pages[3] != pages[4]
    )  # the same, new values twice, fewer series
    provider.shutdown()


def record_translations(reader: Any) -> list[str]:
    """Speeds up ``reader``; the list gets the name of each metric the exporter itself translates while
    the reader collects (not when a family's samples are made from its recipe)."""
    from otel_numa.sdk_private import speed_up_prometheus_reader

    collector = reader._collector
    exporters_own = collector._translate_metric
    translated: list[str] = []
    collecting = False

    def recorded(metric: Any, *args: Any, **kwargs: Any) -> None:
        if collecting:
            translated.append(metric.name)
        exporters_own(metric, *args, **kwargs)

    collector._translate_metric = recorded
    assert speed_up_prometheus_reader(reader)
    reusing = collector._translate_metric

    def collected(*args: Any, **kwargs: Any) -> None:
        nonlocal collecting
        collecting = True
        try:
            reusing(*args, **kwargs)
        finally:
            collecting = False

    collector._translate_metric = collected
    return translated


def test_compact_keys_keep_the_sdks_series_apart_and_together() -> None:
    """With the SDK's attribute key replaced: the same attributes in another dict order are one series;
    values the SDK tells apart by type (1, 1.0, True, "1") and nested values stay separate series; a key
    the SDK's cleaning drops is still dropped."""
    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    observed = [
        Observation(1, {"a": "x", "b": 2}),
        Observation(2, {"b": 2, "a": "x"}),  # the same series: the later value wins
        Observation(3, {"a": 1}),
        Observation(4, {"a": 1.0}),
        Observation(5, {"a": True}),
        Observation(6, {"a": "1"}),
        Observation(7, {"a": ("x", "y")}),
        Observation(8, {"": "dropped", "c": "kept"}),
    ]
    provider.get_meter("guard").create_observable_gauge("g", callbacks=[lambda _options: observed])
    data = reader.get_metrics_data()
    assert data is not None
    points = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    got = sorted(
        (getattr(point, "value", None), sorted((k, repr(v)) for k, v in (point.attributes or {}).items()))
        for point in points
    )
    assert got == [
        (2, [("a", "'x'"), ("b", "2")]),
        (3, [("a", "1")]),
        (4, [("a", "1.0")]),
        (5, [("a", "True")]),
        (6, [("a", "'1'")]),
        (7, [("a", "('x', 'y')")]),
        (8, [("c", "'kept'")]),
    ]
    provider.shutdown()


def test_reused_otlp_requests_equal_the_exporters_own_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's instruments on a node whose values change and whose pods come and go: every request
    the exporters' ``encode_metrics`` hands out is, byte for byte, the encoder's own, and a push whose
    series are those of the previous push is not encoded again."""
    import sys

    from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics import ObservableCounter
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    from otel_numa.instruments import register_instruments
    from otel_numa.instruments.catalogue import METRICS
    from otel_numa.sdk_private import FAST_PATHS, reuse_otlp_requests

    modules = {
        "grpc": "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
        "http/protobuf": "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    }
    for name in modules.values():
        __import__(name)
    assert all(reuse_otlp_requests(protocol) for protocol in modules)
    FAST_PATHS.install()
    encode = sys.modules[modules["grpc"]].encode_metrics
    encoded = calls_to(monkeypatch, encode, "_encode")  # the exporter's own encoder, as wrapped
    for temporality in (AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA):
        # delta sums start anew at every push: their start times are written in too
        node, agent = small_node(tmp_path / temporality.name)
        reader = InMemoryMetricReader(preferred_temporality={ObservableCounter: temporality})
        provider = MeterProvider(metric_readers=[reader])
        names = [spec.name for spec in METRICS if spec.group.value != "compat"]
        register_instruments(provider.get_meter("t"), agent.store, names, "n")
        pushes, encoded_at = [], []
        for generation in generations(node, agent):
            with agent.store.pinned():
                data = reader.get_metrics_data()
            assert data is not None
            before = len(encoded)
            request = encode(data)
            if len(encoded) > before:
                encoded_at.append(generation)
            assert request == encode_metrics(data), (temporality, generation)
            pushed = request.SerializeToString()
            assert pushed == encode_metrics(data).SerializeToString(), (temporality, generation)
            assert b"numa.container.memory.usage" in pushed
            pushes.append(pushed)
        assert encoded_at == [0, 4]  # then only when a pod went
        assert pushes[2] != pushes[3]  # with the new values written in
        provider.shutdown()


@pytest.mark.parametrize("series_per_slice", [128, 5])
def test_pages_with_new_values_written_in_are_the_libraries_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, series_per_slice: int
) -> None:
    """The page of a node whose per-container values change every round, and then loses a pod, is byte
    for byte what prometheus_client writes, in both formats: families with the same series get their new
    values written into the previous text, families with other series are rendered again, a slice of
    series at a time (with 5, the per-container families span several slices; after the pod goes, two
    containers of unknown name have fewer attributes, and their families are rendered whole)."""
    import prometheus_client.exposition as exposition
    import prometheus_client.openmetrics.exposition as openmetrics

    from otel_numa import sdk_private
    from otel_numa.pipeline import build_pipeline
    from otel_numa.sdk_private import RenderedFamilies, install_family_rendering

    monkeypatch.setattr(sdk_private, "SERIES_PER_SLICE", series_per_slice)
    sliced = calls_to(monkeypatch, sdk_private, "_sample_lines")  # the slices after a family's first
    written_in = calls_to(monkeypatch, sdk_private, "_with_new_values")  # (known, values, ...)
    rendered = install_family_rendering()
    assert isinstance(rendered, RenderedFamilies)
    for encode, original in (
        (openmetrics.generate_latest, rendered.openmetrics_encoder),
        (exposition.generate_latest, rendered.text_encoder),
    ):
        # no health series: their ages move between the two collections compared
        node, agent = small_node(tmp_path / original.__module__, disable="health")
        pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
        assert pipeline.registry is not None
        pages: list[bytes] = []
        written_in.clear()
        for generation in generations(node, agent):
            page = encode(pipeline.registry)
            assert page == original(pipeline.registry), generation
            assert b"numa_container_memory_usage_bytes{" in page
            pages.append(page)
        assert pages[1] != pages[2] != pages[3] != pages[4]
        # the families' names, from the "# HELP <name> ..." line their text starts with
        assert b"numa_container_memory_usage_bytes" in {call[0].text.split(b" ")[2] for call in written_in}
        assert bool(sliced) is (series_per_slice == 5)
        pipeline.shutdown(timeout_s=1)


def test_a_scrape_never_holds_a_whole_large_family_of_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A family of one sample per series is translated and rendered a slice at a time: whenever the
    library's encoder runs during the first scrape (the one that renders every family), fewer
    prometheus_client Samples exist than the largest family has series."""
    import prometheus_client.exposition as exposition
    from prometheus_client.samples import Sample

    from otel_numa import sdk_private
    from otel_numa.pipeline import build_pipeline

    monkeypatch.setattr(sdk_private, "SERIES_PER_SLICE", 4)
    renderer = sdk_private.install_family_rendering()
    assert renderer is not None
    live: list[int] = []
    encoder = renderer.text_encoder

    def samples() -> int:
        return sum(1 for thing in gc.get_objects() if type(thing) is Sample)

    def counting(registry: Any, **options: str) -> bytes:
        live.append(samples() - before)  # beyond those other tests left behind
        return encoder(registry, **options)

    monkeypatch.setattr(renderer, "text_encoder", counting)
    _node, agent = small_node(tmp_path / "node", disable="health")
    pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    assert pipeline.registry is not None
    agent.refresh_background()
    gc.collect()
    before = samples()
    page = exposition.generate_latest(pipeline.registry)
    series = Counter(line.split(b"{")[0] for line in page.splitlines() if line and not line.startswith(b"#"))
    largest = series.most_common(1)[0][1]
    assert largest >= 20
    assert 0 < max(live) < largest, (max(live), largest)
    assert len(live) > len(series)  # an encoding per slice
    pipeline.shutdown(timeout_s=1)


def test_between_scrapes_the_page_keeps_no_samples_of_gauges_and_counters(tmp_path: Path) -> None:
    """Between scrapes, the families of one sample per data point are kept as their values and text only:
    no prometheus_client Sample (a name and a label dict per series) outlives the scrape that made it,
    while series are new, values change, and series go."""
    import prometheus_client.exposition as exposition

    from otel_numa.pipeline import build_pipeline

    node, agent = small_node(tmp_path / "node", disable="health")
    pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    assert pipeline.registry is not None
    renderer = getattr(exposition.generate_latest, "__self__", None)
    for generation in generations(node, agent):
        page = exposition.generate_latest(pipeline.registry)
        series = sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))
        kept = samples_reachable_from(pipeline, renderer)
        assert series > 100 and kept <= 2, (generation, series, kept)  # target_info and python_info
    pipeline.shutdown(timeout_s=1)


def samples_reachable_from(*roots: object) -> int:
    """prometheus_client Samples that ``roots`` hold, directly or not (not through modules or classes;
    the collector does not track most Samples, so they are found by walking references)."""
    import sys
    import types

    from prometheus_client.samples import Sample

    module_dicts = {id(vars(module)) for module in list(sys.modules.values()) if module is not None}
    seen: set[int] = set()
    found = 0
    stack = list(roots)
    while stack:
        thing = stack.pop()
        if id(thing) in seen or isinstance(thing, (types.ModuleType, type)) or id(thing) in module_dicts:
            continue
        seen.add(id(thing))
        found += type(thing) is Sample
        stack.extend(gc.get_referents(thing))
    return found


def test_measurements_are_reused_only_for_the_same_list_of_observations(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An instrument whose callback hands back the same list gets the Measurements made from it last time;
    a new list, a generator callback, non-finite values and a failing callback behave as the SDK has them."""
    from opentelemetry.sdk.metrics._internal.instrument import _Asynchronous

    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install()
    reused = _Asynchronous.__dict__["callback"]
    sdk_loops = calls_to(monkeypatch, reused, "_callback")  # (instrument, options)
    kept = [Observation(1, {"a": "x"}), Observation(float("nan"), {"a": "nan"})]
    current = {"list": kept}

    def generator() -> Any:
        while True:
            yield [Observation(7, {"g": "y"})]

    def failing(_options: Any) -> list[Observation]:
        raise RuntimeError("broken callback")

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("guard")
    meter.create_observable_gauge("kept", callbacks=[lambda _options: current["list"]])
    meter.create_observable_gauge("generated", callbacks=[generator()])
    meter.create_observable_gauge("failing", callbacks=[failing])

    def values() -> dict[str, list[tuple[object, object]]]:
        data = reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: [
                (getattr(point, "value", None), dict(point.attributes or {}))
                for point in metric.data.data_points
            ]
            for metric in data.resource_metrics[0].scope_metrics[0].metrics
        }

    first = values()
    assert first == {"kept": [(1, {"a": "x"})], "generated": [(7, {"g": "y"})]}
    assert "Callback failed for instrument failing" in caplog.text
    assert "non-finite value nan" in caplog.text
    sdk_loops.clear()
    assert values() == first  # the same list: no new Measurements for "kept"
    assert [instrument.name for instrument, _ in sdk_loops] == ["generated", "failing"]
    current["list"] = [Observation(2, {"a": "x"})]
    sdk_loops.clear()
    assert values()["kept"] == [(2, {"a": "x"})]
    assert [instrument.name for instrument, _ in sdk_loops] == ["kept", "generated", "failing"]
    provider.shutdown()


def test_unchanged_instruments_repeat_their_points_with_one_cumulative_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one cumulative reader, an instrument that hands back the same list gets its last points with a
    new time and nothing consumed; a new list, a second reader, delta temporality and a janitor's forgetting
    all take the SDK's path, with the SDK's values."""
    from dataclasses import fields, replace

    from opentelemetry.sdk.metrics import ObservableCounter
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _ViewInstrumentMatch
    from opentelemetry.sdk.metrics.export import AggregationTemporality, NumberDataPoint

    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install()
    # the repeated points are made through the instance's __dict__
    assert "__slots__" not in vars(NumberDataPoint)
    assert [f.name for f in fields(NumberDataPoint)] == [
        "attributes",
        "start_time_unix_nano",
        "time_unix_nano",
        "value",
        "exemplars",
    ]
    repeated = _ViewInstrumentMatch.__dict__["collect"]
    sdk_collects = calls_to(monkeypatch, repeated, "_collect")  # (match, temporality, time)
    current = {"list": [Observation(5, {"pod": "a"}), Observation(7, {"pod": "b"})]}

    def provider_with(*readers: InMemoryMetricReader) -> MeterProvider:
        provider = MeterProvider(metric_readers=list(readers))
        provider.get_meter("guard").create_observable_counter(
            "c", callbacks=[lambda _options: current["list"]]
        )
        return provider

    def points(reader: InMemoryMetricReader) -> list[Any]:
        data = reader.get_metrics_data()
        assert data is not None
        return list(data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points)

    def values(reader: InMemoryMetricReader) -> dict[str, object]:
        return {str(dict(point.attributes)["pod"]): point.value for point in points(reader)}

    # one cumulative reader: the second collection of the same list repeats the first's points
    reader = InMemoryMetricReader()
    provider = provider_with(reader)
    first = points(reader)
    second = points(reader)
    assert len(sdk_collects) == 1
    assert [(p.attributes, p.start_time_unix_nano, p.value) for p in second] == [
        (p.attributes, p.start_time_unix_nano, p.value) for p in first
    ]
    assert all(b.time_unix_nano > a.time_unix_nano for a, b in zip(first, second, strict=True))
    assert all(isinstance(p, NumberDataPoint) and list(p.exemplars) == [] for p in second)
    assert second == [
        replace(p, time_unix_nano=second[0].time_unix_nano) for p in first
    ]  # dataclass equality
    current["list"] = [Observation(6, {"pod": "a"}), Observation(7, {"pod": "b"})]
    assert values(reader) == {"a": 6, "b": 7} and len(sdk_collects) == 2
    assert values(reader) == {"a": 6, "b": 7} and len(sdk_collects) == 2
    # the janitor forgot a pod's series: the SDK collects again, without it
    current["list"] = [Observation(6, {"k8s.pod.uid": "a"}), Observation(7, {"k8s.pod.uid": "b"})]
    points(reader)
    assert DepartedSeriesJanitor(provider).forget(frozenset({"a"})) == 1
    sdk_collects.clear()
    assert [p.value for p in points(reader)] == [6, 7] and len(sdk_collects) == 1
    provider.shutdown()

    # two readers, or a delta reader: every collection is the SDK's
    current["list"] = [Observation(5, {"pod": "a"})]
    first_reader, second_reader = InMemoryMetricReader(), InMemoryMetricReader()
    provider = provider_with(first_reader, second_reader)
    sdk_collects.clear()
    assert values(first_reader) == values(second_reader) == {"a": 5}
    current["list"] = [Observation(8, {"pod": "a"})]
    assert values(first_reader) == values(second_reader) == {"a": 8}
    assert values(first_reader) == values(second_reader) == {"a": 8}
    assert len(sdk_collects) == 6
    provider.shutdown()
    delta = InMemoryMetricReader(preferred_temporality={ObservableCounter: AggregationTemporality.DELTA})
    provider = provider_with(delta)
    assert values(delta) == {"a": 8}
    assert values(delta) == {"a": 0}  # nothing added since
    provider.shutdown()


def test_new_values_for_the_same_attribute_dicts_are_the_sdks_measurements(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A new list whose observations keep last time's attribute dicts, in order, gets copies of last time's
    Measurements with the new values, equal to what the SDK's loop makes; anything else is the SDK's loop."""
    from opentelemetry.sdk.metrics._internal.instrument import _Asynchronous
    from opentelemetry.sdk.metrics._internal.measurement import Measurement

    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install()
    assert "__slots__" not in vars(Measurement)  # copies are made through the instance's __dict__
    reused = _Asynchronous.__dict__["callback"]
    sdk_loops = calls_to(monkeypatch, reused, "_callback")
    a, b = {"pod": "a"}, {"pod": "b"}
    current = {"list": [Observation(1, a), Observation(2.5, b)]}
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrument = provider.get_meter("guard").create_observable_gauge(
        "g", callbacks=[lambda _options: current["list"]]
    )

    def measurements() -> list[Any]:
        return list(reused(instrument, None))

    first = measurements()
    assert len(sdk_loops) == 1
    current["list"] = [Observation(3, a), Observation(4.5, b)]
    copies = measurements()
    assert len(sdk_loops) == 1  # no SDK loop
    assert [(m.value, m.attributes, m.instrument) for m in copies] == [
        (3, a, instrument),
        (4.5, b, instrument),
    ]
    assert all(type(m) is Measurement for m in copies) and copies[0] is not first[0]
    assert [(m.value, m.attributes) for m in first] == [(1, a), (2.5, b)]  # last time's are left as they were
    for other, expected in (
        ([Observation(3, {"pod": "a"}), Observation(4.5, b)], [(3, {"pod": "a"}), (4.5, b)]),  # another dict
        ([Observation(4.5, b), Observation(3, a)], [(4.5, b), (3, a)]),  # another order
        # non-finite: the SDK drops it and says so
        ([Observation(float("inf"), a), Observation(1, b)], [(1, b)]),
        ([Observation(True, a), Observation(1, b)], [(True, a), (1, b)]),  # not a plain number
    ):
        current["list"] = other
        loops = len(sdk_loops)
        made = measurements()
        assert len(sdk_loops) == loops + 1  # the SDK's loop, once
        assert [(m.value, m.attributes) for m in made] == expected
        assert all(type(m) is Measurement for m in made)
        current["list"] = [Observation(3, a), Observation(4.5, b)]
        measurements()  # back to a, b for the next case
    assert "non-finite value inf" in caplog.text
    provider.shutdown()


def test_new_values_for_the_same_series_are_the_sdks_points_without_its_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one cumulative reader, a new list with last time's attribute dicts in place gives the SDK's
    points (its order, start times, the new values) without the SDK consuming or collecting; a list where
    one attribute set appears twice, and a view that drops attribute keys, take the SDK's path."""
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _ViewInstrumentMatch
    from opentelemetry.sdk.metrics.view import View

    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install()
    sdk_collects = calls_to(monkeypatch, _ViewInstrumentMatch.__dict__["collect"], "_collect")
    a, b, c = {"pod": "a", "x": "1"}, {"pod": "b", "x": "1"}, {"pod": "c", "x": "1"}
    current = {"list": [Observation(1, b), Observation(2, c)]}

    def provider_with(*readers: InMemoryMetricReader, views: tuple[View, ...] = ()) -> MeterProvider:
        provider = MeterProvider(metric_readers=list(readers), views=list(views))
        meter = provider.get_meter("guard")
        meter.create_observable_counter("c", callbacks=[lambda _options: current["list"]])
        meter.create_observable_gauge("g", callbacks=[lambda _options: current["list"]])
        return provider

    def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[Any, ...]]]:
        data = reader.get_metrics_data()
        assert data is not None
        found: dict[str, list[tuple[Any, ...]]] = {}
        for metric in data.resource_metrics[0].scope_metrics[0].metrics:
            number_points: list[Any] = list(metric.data.data_points)
            found[metric.name] = [
                (dict(p.attributes), p.value, p.start_time_unix_nano, p.time_unix_nano) for p in number_points
            ]
        return found

    def without_times(collected: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
        return {name: [point[:2] for point in series] for name, series in collected.items()}

    one = InMemoryMetricReader()
    # the SDK's own path on every collection: a provider with two readers
    sdk, other = InMemoryMetricReader(), InMemoryMetricReader()
    providers = [provider_with(one), provider_with(sdk, other)]
    first = points(one)
    points(sdk), points(other)
    current["list"] = [Observation(3, a), Observation(4, b), Observation(5, c)]  # a new series, listed first
    second = points(one)
    points(sdk), points(other)
    collects = len(sdk_collects)
    current["list"] = [Observation(6, a), Observation(7.5, b), Observation(8, c)]
    third = points(one)
    assert len(sdk_collects) == collects  # nothing collected by the SDK for the reader alone
    assert without_times(third) == without_times(points(sdk))
    # the SDK's order (its aggregations': a came last) with last time's start times and a new time
    assert [point[:3] for point in third["c"]] == [
        (b, 7.5, first["c"][0][2]),
        (c, 8, first["c"][1][2]),
        (a, 6, second["c"][2][2]),
    ]
    assert [point[2] for point in third["g"]] == [None, None, None]
    assert all(now[3] > before[3] for now, before in zip(third["c"], second["c"], strict=True))
    collects = len(sdk_collects)
    assert without_times(points(one)) == without_times(third) and len(sdk_collects) == collects  # repeated

    # one attribute set twice: the counter sums them, so the SDK collects
    current["list"] = [Observation(1, a), Observation(2, a)]
    assert without_times(points(one))["c"] == [(a, 3)]
    collects = len(sdk_collects)
    current["list"] = [Observation(5, a), Observation(6, a)]
    assert without_times(points(one)) == {"c": [(a, 11)], "g": [(a, 6)]}
    assert len(sdk_collects) == collects + 2
    for provider in providers:
        provider.shutdown()

    # a view that keeps only "pod": its points are not one per attribute dict, so the SDK collects
    current["list"] = [Observation(1, a), Observation(2, b)]
    kept = InMemoryMetricReader()
    provider = provider_with(kept, views=(View(instrument_name="c", attribute_keys={"pod"}),))
    points(kept)
    collects = len(sdk_collects)
    current["list"] = [Observation(3, a), Observation(4, b)]
    assert without_times(points(kept))["c"] == [({"pod": "a"}, 3), ({"pod": "b"}, 4)]
    assert len(sdk_collects) == collects + 1  # the counter's; the gauge's view keeps every key
    provider.shutdown()


def test_the_agents_own_series_keep_their_attribute_dict_in_the_sdk_and_others_get_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new series of the agent's meter: the SDK's aggregation keeps the observation's dict itself (the
    agent never changes it); another meter's series, and a view that keeps only some keys, get the SDK's
    copy. The values are the SDK's either way."""
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _ViewInstrumentMatch
    from opentelemetry.sdk.metrics.view import View

    from otel_numa.pipeline import METER_NAME
    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install(own_meter=METER_NAME)
    sdk_consumes = calls_to(monkeypatch, _ViewInstrumentMatch.__dict__["consume_measurement"], "_consume")
    a, b = {"pod": "a", "x": "1"}, {"pod": "b", "x": "1"}
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader], views=[View(instrument_name="*.kept", attribute_keys={"pod"})]
    )
    for meter_name in (METER_NAME, "someone-else"):
        meter = provider.get_meter(meter_name)
        for name in ("g", "kept"):
            meter.create_observable_gauge(
                f"{meter_name}.{name}", callbacks=[lambda _options: [Observation(1, a), Observation(2, b)]]
            )
    data = reader.get_metrics_data()
    assert data is not None
    by_name: dict[str, list[tuple[Any, Any]]] = {}
    for scope in data.resource_metrics[0].scope_metrics:
        for metric in scope.metrics:
            points: list[Any] = list(metric.data.data_points)
            by_name[metric.name] = [(point.attributes, point.value) for point in points]
    ours = by_name[f"{METER_NAME}.g"]
    assert ours == [(a, 1), (b, 2)] and ours[0][0] is a and ours[1][0] is b
    theirs = by_name["someone-else.g"]
    assert theirs == [(a, 1), (b, 2)] and theirs[0][0] is not a and theirs[1][0] is not b
    for name in (f"{METER_NAME}.kept", "someone-else.kept"):
        assert by_name[name] == [({"pod": "a"}, 1), ({"pod": "b"}, 2)]
    assert len(sdk_consumes) == 6  # two Measurements of each instrument but the agent's plain one
    provider.shutdown()


def test_a_series_with_a_new_dict_keeps_only_that_dict_and_own_series_share_one_lock() -> None:
    """A series observed with a new, equal attribute dict: its points carry the new dict,
    so the SDK no longer holds the old one beside the instrument's. The agent's own aggregations share
    one lock; another meter's keep one each."""
    import threading

    from otel_numa.pipeline import METER_NAME
    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install(own_meter=METER_NAME)
    rounds: list[list[Observation]] = []
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    for meter_name in (METER_NAME, "someone-else"):
        provider.get_meter(meter_name).create_observable_gauge(
            f"{meter_name}.g", callbacks=[lambda _options: rounds[-1]]
        )

    def points_of(name: str) -> list[Any]:
        data = reader.get_metrics_data()
        assert data is not None
        return [
            point
            for scope in data.resource_metrics[0].scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]

    first, other = {"pod": "a"}, {"pod": "b"}
    rounds.append([Observation(1, first), Observation(2, other)])
    assert points_of(f"{METER_NAME}.g")[0].attributes is first
    again = {"pod": "a"}
    rounds.append([Observation(3, again), Observation(2, other)])
    back = points_of(f"{METER_NAME}.g")
    assert [(p.attributes, p.value) for p in back] == [({"pod": "a"}, 3), ({"pod": "b"}, 2)]
    assert back[0].attributes is again and back[1].attributes is other

    storage = provider._measurement_consumer._reader_storages[reader]
    locks: dict[str, list[Any]] = {}
    for instrument, matches in storage._instrument_view_instrument_matches.items():
        for match in matches:
            for aggregation in match._attributes_aggregation.values():
                locks.setdefault(instrument.instrumentation_scope.name, []).append(aggregation._lock)
    ours, theirs = locks[METER_NAME], locks["someone-else"]
    assert len(ours) == len(theirs) == 2
    assert ours[0] is ours[1] and isinstance(ours[0], type(threading.RLock()))
    assert theirs[0] is not theirs[1] and theirs[0] is not ours[0]
    provider.shutdown()


def test_series_no_longer_observed_leave_the_sdk_at_once_for_the_agents_meter_only() -> None:
    """An attribute set the agent's instrument stops observing (a pod still alive, placed anew) leaves the
    SDK's storage at that collection, not when its pod goes; observed again, it is a new series with a new
    start time. Another meter's sets stay, as the SDK keeps them."""
    from otel_numa.pipeline import METER_NAME
    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install(own_meter=METER_NAME)
    observed: dict[str, list[Observation]] = {}
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    for meter_name in (METER_NAME, "someone-else"):
        provider.get_meter(meter_name).create_observable_counter(
            f"{meter_name}.c", callbacks=[lambda _options: observed["list"]]
        )
    storage = provider._measurement_consumer._reader_storages[reader]

    def held() -> dict[str, int]:
        return {
            instrument.instrumentation_scope.name: len(match._attributes_aggregation)
            for instrument, matches in storage._instrument_view_instrument_matches.items()
            for match in matches
        }

    def starts() -> dict[str, int]:
        data = reader.get_metrics_data()
        assert data is not None
        scopes = data.resource_metrics[0].scope_metrics
        metric = next(m for s in scopes for m in s.metrics if m.name == f"{METER_NAME}.c")
        points: list[Any] = list(metric.data.data_points)
        return {str(p.attributes["node"]): p.start_time_unix_nano for p in points}

    old, new, shared = {"node": "0"}, {"node": "1"}, {"node": "shared"}
    observed["list"] = [Observation(5, old), Observation(7, shared)]
    first = starts()
    assert held() == {METER_NAME: 2, "someone-else": 2}
    observed["list"] = [Observation(6, new), Observation(8, shared)]
    second = starts()
    assert set(second) == {"1", "shared"} and second["shared"] == first["shared"]
    assert held() == {METER_NAME: 2, "someone-else": 3}
    observed["list"] = [Observation(9, old), Observation(8, shared)]
    third = starts()
    assert third["0"] > first["0"] and third["shared"] == first["shared"]
    assert held() == {METER_NAME: 2, "someone-else": 3}
    provider.shutdown()


def test_points_written_without_measurements_get_them_when_the_sdk_collects_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """New values written into the last points leave no Measurements behind; when the same list must then
    go through the SDK (the janitor replaced the aggregations), its Measurements are made from it, with
    its values."""
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _ViewInstrumentMatch

    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install()
    sdk_collects = calls_to(monkeypatch, _ViewInstrumentMatch.__dict__["collect"], "_collect")
    a, b, c = ({"k8s.pod.uid": uid} for uid in "abc")
    current = {"list": [Observation(1, a), Observation(2, b), Observation(3, c)]}
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("guard").create_observable_counter("c", callbacks=[lambda _options: current["list"]])

    def values() -> dict[str, object]:
        data = reader.get_metrics_data()
        assert data is not None
        points: list[Any] = list(data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points)
        return {str(dict(point.attributes)["k8s.pod.uid"]): point.value for point in points}

    assert values() == {"a": 1, "b": 2, "c": 3} and len(sdk_collects) == 1
    current["list"] = [Observation(4, a), Observation(5, b), Observation(6, c)]
    assert values() == {"a": 4, "b": 5, "c": 6} and len(sdk_collects) == 1  # written in
    assert DepartedSeriesJanitor(provider).forget(frozenset({"a", "b"})) == 1
    assert values() == {"a": 4, "b": 5, "c": 6} and len(sdk_collects) == 2  # the SDK's, from the same list
    current["list"] = [Observation(7, a), Observation(8, b)]
    assert values() == {"a": 7, "b": 8} and len(sdk_collects) == 3
    provider.shutdown()


def test_a_reused_otlp_request_gets_the_new_start_of_a_series_the_janitor_forgot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A series of the agent's meter that the janitor forgot while it was still observed comes back with the
    same attribute dict but a new aggregation and start time: the reused request carries that start time,
    as the encoder's own request does."""
    import sys

    from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics

    from otel_numa.pipeline import METER_NAME
    from otel_numa.sdk_private import FAST_PATHS, reuse_otlp_requests

    module = "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"
    __import__(module)
    assert reuse_otlp_requests("grpc")
    FAST_PATHS.install(own_meter=METER_NAME)
    encode = sys.modules[module].encode_metrics
    encoded = calls_to(monkeypatch, encode, "_encode")  # the exporter's own encoder, as wrapped
    observations = [Observation(1, {"k8s.pod.uid": "a"}), Observation(2, {"k8s.pod.uid": "b"})]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter(METER_NAME).create_observable_counter("c", callbacks=[lambda _options: observations])
    requests = []
    for round_ in range(3):
        if round_ == 2:
            assert DepartedSeriesJanitor(provider).forget(frozenset({"a"})) == 1  # b is still observed
        data = reader.get_metrics_data()
        assert data is not None
        request = encode(data)
        assert request == encode_metrics(data), round_
        requests.append(request)
    assert len(encoded) == 1  # the later pushes have the same attribute dicts: not encoded again
    starts = [
        point.start_time_unix_nano
        for point in requests[2].resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points
    ]
    assert starts[0] < starts[1]  # b's aggregation is new
    provider.shutdown()


def test_the_agents_observed_series_are_slotted_and_give_the_sdks_points_in_either_temporality() -> None:
    """A series of the agent's observable counters, up-down counters and gauges (no exemplars, through
    the pipeline's view) is kept as an ``_ObservedSum`` or ``_ObservedLastValue`` instead of the SDK's
    aggregation; another meter's keep the SDK's. Their points are the SDK's, collected cumulatively and as
    deltas: values, a series observed twice in one callback, start times."""
    from opentelemetry.sdk.metrics import ObservableCounter, ObservableGauge, ObservableUpDownCounter
    from opentelemetry.sdk.metrics.export import AggregationTemporality
    from opentelemetry.sdk.metrics.view import View

    from otel_numa.pipeline import _NO_EXEMPLARS, METER_NAME, _no_exemplars
    from otel_numa.sdk_private import FAST_PATHS

    FAST_PATHS.install(own_meter=METER_NAME, stateless_reservoir=_NO_EXEMPLARS)
    delta = AggregationTemporality.DELTA
    cumulative_reader = InMemoryMetricReader()
    delta_reader = InMemoryMetricReader(
        preferred_temporality={
            ObservableCounter: delta,
            ObservableUpDownCounter: delta,
            ObservableGauge: delta,
        }
    )
    provider = MeterProvider(
        metric_readers=[cumulative_reader, delta_reader],
        views=[View(instrument_name="*", exemplar_reservoir_factory=_no_exemplars)],
    )
    a, b = {"pod": "a"}, {"pod": "b"}
    rounds = [
        [Observation(5, a), Observation(2, b), Observation(3, b)],
        [Observation(7, a), Observation(1, b), Observation(1, b)],
        [Observation(9.5, a), Observation(4, b), Observation(0.5, b)],
    ]
    now: list[list[Observation]] = []
    kinds = ("counter", "up_down_counter", "gauge")
    for meter_name in (METER_NAME, "someone-else"):
        meter = provider.get_meter(meter_name)
        for kind in kinds:
            create = getattr(meter, f"create_observable_{kind}")
            create(f"{meter_name}.{kind}", callbacks=[lambda _options: now[-1]])

    def collected(reader: InMemoryMetricReader) -> dict[str, list[tuple[Any, Any, Any]]]:
        data = reader.get_metrics_data()
        assert data is not None
        found: dict[str, list[tuple[Any, Any, Any]]] = {}
        for scope in data.resource_metrics[0].scope_metrics:
            for metric in scope.metrics:
                points: list[Any] = list(metric.data.data_points)
                found[metric.name] = [(p.attributes, p.start_time_unix_nano, p.value) for p in points]
                assert all(list(p.exemplars) == [] for p in points)
        return found

    history: dict[str, list[list[tuple[Any, Any, Any]]]] = {}
    before_first = time.time_ns()
    for observations in rounds:
        now.append(observations)
        if len(now) == 2:
            after_first = time.time_ns()
        for name, reader in (("cumulative", cumulative_reader), ("delta", delta_reader)):
            for metric_name, points in collected(reader).items():
                history.setdefault(f"{name} {metric_name}", []).append(points)

    for name in ("cumulative", "delta"):
        for kind in kinds:
            ours, theirs = history[f"{name} {METER_NAME}.{kind}"], history[f"{name} someone-else.{kind}"]
            assert [[(dict(at), v) for at, _, v in r] for r in ours] == [
                [(dict(at), v) for at, _, v in r] for r in theirs
            ], (name, kind)
            if kind != "gauge":
                assert [s is None for r in ours for _, s, _ in r] == [False] * 6
    cumulative_values = [[v for _, _, v in r] for r in history[f"cumulative {METER_NAME}.counter"]]
    assert cumulative_values == [[5, 5], [7, 2], [9.5, 4.5]]
    delta_values = [[v for _, _, v in r] for r in history[f"delta {METER_NAME}.counter"]]
    assert delta_values == [[5, 5], [2, -3], [2.5, 2.5]]
    # cumulative: each series keeps the start it was created with; delta: each starts at the last
    # collection. The SDK reads the clock for each series of a first collection; the agent's series made
    # then share the first one's start, read within the same collection.
    expected = {
        ("cumulative", METER_NAME): [0, 0, 0, 0, 0, 0],
        ("cumulative", "someone-else"): [0, 1, 0, 1, 0, 1],
        ("delta", METER_NAME): [0, 0, 1, 1, 2, 2],
        ("delta", "someone-else"): [0, 1, 2, 2, 3, 3],
    }
    for (name, meter_name), pattern in expected.items():
        for kind in ("counter", "up_down_counter"):
            assert _start_pattern(history[f"{name} {meter_name}.{kind}"]) == pattern, (name, meter_name, kind)
    for kind in ("counter", "up_down_counter"):
        first_starts = {s for _, s, _ in history[f"cumulative {METER_NAME}.{kind}"][0]}
        assert len(first_starts) == 1 and before_first <= min(first_starts) <= after_first

    observed: dict[str, set[str]] = {}
    for storage in provider._measurement_consumer._reader_storages.values():
        for instrument, matches in storage._instrument_view_instrument_matches.items():
            for match in matches:
                for aggregation in match._attributes_aggregation.values():
                    scope = instrument.instrumentation_scope.name
                    observed.setdefault(scope, set()).add(type(aggregation).__name__)
    assert observed == {
        METER_NAME: {"_ObservedSum", "_ObservedLastValue"},
        "someone-else": {"_SumAggregation", "_LastValueAggregation"},
    }
    provider.shutdown()


def _start_pattern(rounds: list[list[tuple[Any, Any, Any]]]) -> list[int]:
    """Each point's start as the number of distinct starts seen before it first appeared (0: the first)."""
    seen: list[Any] = []
    pattern = []
    for round_points in rounds:
        for _, start, _ in round_points:
            if start not in seen:
                seen.append(start)
            pattern.append(seen.index(start))
    return pattern


def test_slim_points_are_the_sdks_number_data_points_in_a_third_of_the_memory() -> None:
    """The points the agent makes at every collection: NumberDataPoints to every reader and exporter (fields,
    equality both ways, ``dataclasses.asdict`` and ``replace``, JSON), with slots instead of a dict."""
    import dataclasses
    import json
    import sys

    from opentelemetry.sdk.metrics.export import NumberDataPoint

    from otel_numa.sdk_private import SlimPoint, slim_point

    attributes: dict[str, str | int] = {"k8s.pod.uid": "a", "numa.node.id": 1}
    slim = slim_point(attributes, 10, 20, 4096)
    sdk = NumberDataPoint(attributes=attributes, start_time_unix_nano=10, time_unix_nano=20, value=4096)
    assert isinstance(slim, NumberDataPoint) and type(slim) is SlimPoint
    assert slim == sdk and sdk == slim and slim != dataclasses.replace(sdk, value=1)
    assert json.loads(slim.to_json()) == json.loads(sdk.to_json())
    assert dataclasses.asdict(slim) == {**dataclasses.asdict(sdk), "exemplars": ()}  # one shared empty tuple
    moved = dataclasses.replace(slim, time_unix_nano=30)
    assert moved == dataclasses.replace(sdk, time_unix_nano=30) and slim.time_unix_nano == 20
    assert not slim.exemplars and slim_point(attributes, None, 20, 1.5).start_time_unix_nano is None
    assert not vars(slim), "the fields live in slots"
    with pytest.raises(dataclasses.FrozenInstanceError):
        slim.value = 1  # type: ignore[misc]
    assert sys.getsizeof(slim) * 2 < sys.getsizeof(sdk) + sys.getsizeof(vars(sdk)) + sys.getsizeof([])


def test_slim_observations_give_the_sdk_the_points_of_the_apis_observations() -> None:
    """The SDK's own loop over a callback (another meter's instruments, a first collection) reads a
    SlimObservation, and the observations of Observations' columns, as it reads an Observation: the same
    points, for every kind of observable instrument."""
    from otel_numa.sdk_private import Observations, SlimObservation, slim_observation

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("someone-else")
    observed: list[tuple[float, dict[str, Any]]] = [(5, {"pod": "a"}), (2.5, {"pod": "b", "numa": 1})]
    for kind in ("counter", "up_down_counter", "gauge"):
        create = getattr(meter, f"create_observable_{kind}")
        create(f"api.{kind}", callbacks=[lambda _o: [Observation(v, a) for v, a in observed]])
        create(f"slim.{kind}", callbacks=[lambda _o: [slim_observation(v, a) for v, a in observed]])
        create(
            f"columns.{kind}",
            callbacks=[lambda _o: Observations([v for v, _a in observed], tuple(a for _v, a in observed))],
        )
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        metric.name: [(dict(p.attributes or {}), getattr(p, "value", None)) for p in metric.data.data_points]
        for metric in data.resource_metrics[0].scope_metrics[0].metrics
    }
    for kind in ("counter", "up_down_counter", "gauge"):
        expected = [(a, v) for v, a in observed]
        assert points[f"slim.{kind}"] == points[f"columns.{kind}"] == points[f"api.{kind}"] == expected
    slim = SlimObservation(1, {"pod": "a"})
    assert not hasattr(slim, "__dict__") and slim.context is None
    provider.shutdown()


def test_observations_in_columns_with_last_times_attributes_tuple_skip_the_sdks_loop_and_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An instrument that hands Observations (the agent's do): new values with last time's attributes tuple
    give the SDK's points with one cumulative reader, without its loop or its collection, and Measurements
    copied from last time's with two readers; another tuple of the same dicts, or a value the SDK drops,
    goes through its loop, with the points it makes."""
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _ViewInstrumentMatch
    from opentelemetry.sdk.metrics._internal.instrument import _Asynchronous

    from otel_numa.sdk_private import FAST_PATHS, Observations

    FAST_PATHS.install()
    sdk_collects = calls_to(monkeypatch, _ViewInstrumentMatch.__dict__["collect"], "_collect")
    sdk_loops = calls_to(monkeypatch, _Asynchronous.__dict__["callback"], "_callback")
    a, b = {"pod": "a"}, {"pod": "b"}
    series = (a, b)
    current = {"observed": Observations([1, 2], series)}
    for readers in (1, 2):
        reader = InMemoryMetricReader()
        others = [InMemoryMetricReader() for _ in range(readers - 1)]
        provider = MeterProvider(metric_readers=[reader, *others])
        provider.get_meter("guard").create_observable_counter("c", callbacks=[lambda _o: current["observed"]])

        def points(reader: InMemoryMetricReader = reader) -> list[tuple[dict[str, Any], Any]]:
            data = reader.get_metrics_data()
            assert data is not None
            (metric,) = data.resource_metrics[0].scope_metrics[0].metrics
            return [(dict(p.attributes or {}), getattr(p, "value", None)) for p in metric.data.data_points]

        current["observed"] = Observations([1, 2], series)
        assert points() == [(a, 1), (b, 2)]
        loops, collects = len(sdk_loops), len(sdk_collects)
        current["observed"] = Observations([3, 4.5], series)
        assert points() == [(a, 3), (b, 4.5)]
        assert len(sdk_loops) == loops  # no loop over the observations: no Measurements, or copies
        assert (len(sdk_collects) == collects) is (readers == 1)
        current["observed"] = Observations([5, 6], (a, b))  # the same dicts in another tuple
        assert points() == [(a, 5), (b, 6)] and len(sdk_loops) == loops + 1
        current["observed"] = Observations([float("nan"), 7], (a, b))  # the SDK drops NaN (a: no point)
        assert points() == [(b, 7)] and len(sdk_loops) == loops + 2
        provider.shutdown()


def test_an_instruments_series_are_one_tuple_in_every_stage_that_keeps_them(tmp_path: Path) -> None:
    """While an instrument's series stay the same, the one tuple of their attribute mappings that it hands
    over (Observations) is what the points kept to repeat them, the page's translation and the kept OTLP
    request hold: no stage keeps a copy of its own, per series, through new values."""
    import sys

    import prometheus_client.exposition as exposition
    from opentelemetry.sdk.metrics._internal.instrument import _Asynchronous
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    from otel_numa.pipeline import build_pipeline
    from otel_numa.sdk_private import Observations, reuse_otlp_requests

    module = "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"
    __import__(module)
    assert reuse_otlp_requests("grpc")
    encode = sys.modules[module].encode_metrics
    requests: list[Any] = []

    class Encoding(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **_: Any) -> MetricExportResult:
            requests.append(encode(metrics_data))
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            return None

    node, agent = small_node(tmp_path / "node", disable="health")

    def encoding(_export: Any) -> MetricExporter:
        return Encoding()

    pipeline = build_pipeline(
        agent.options, agent.store, exporters=("prometheus", "otlp"), otlp_exporter_factory=encoding
    )
    assert pipeline.registry is not None
    for generation in generations(node, agent):
        if generation == 4:  # a pod fewer: other series
            break
        exposition.generate_latest(pipeline.registry)
        pipeline.push(timeout_s=1)
    assert len(requests) == 4
    reused = _Asynchronous.__dict__["callback"]
    usage = [i for i in reused._made if i.name == "numa.container.memory.usage"][-1]  # this provider's
    observed = reused._made[usage].observations
    assert type(observed) is Observations and len(observed) >= 24
    assert reused._unchanged.last[usage].attributes is observed.attributes
    (collector,) = [c for c in pipeline.registry._collector_to_names if hasattr(c, "_translate_metric")]
    translated = collector._translate_metric._known
    (translation,) = [t for key, t in translated.items() if key.startswith("numa.container.memory.usage|")]
    assert translation.attributes is observed.attributes
    assert any(entry is observed.attributes for entry in encode._kept.layout)
    pipeline.shutdown(timeout_s=1)
