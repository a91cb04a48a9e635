"""Guards for the accelerated export path's patches (otel_numa/export/fast/): each passes its own check
on the proven releases, the proven releases are inside the ranges pyproject.toml admits, and each patch's
output is the public libraries' own."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from packaging.requirements import Requirement

from otel_numa.export.fast import PATCHES, PROVEN_RELEASES, choose, shape_problem
from otel_numa.export.fast.forget_departed import DepartedSeriesJanitor
from otel_numa.testing.peers import REPO
from tests.support import generations


def small_node(root: Path, **settings: Any) -> tuple[Any, Any]:
    """A 2-node LargeNode with 6 pods of 2 containers under ``root``, and an Agent reading it."""
    from otel_numa.cli.settings import Settings
    from otel_numa.daemon.agent import Agent
    from otel_numa.testing.large_node import LargeNodeSpec, write_large_node

    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=8, pods=6, containers_per_pod=2, devices_per_resource=2)
    node = write_large_node(root, spec)
    return node, Agent(Settings(**node.settings_values(), **settings).to_options())  # type: ignore[arg-type]


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


def test_the_proven_releases_are_installed_and_inside_the_ranges_pyproject_admits() -> None:
    """The ranges are bounded above (the next major version), and the releases the fast path was proven
    on are installed here (the tests of both paths run on them) and admitted."""
    requirements = {
        requirement.name: requirement
        for requirement in map(
            Requirement, tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
        )
    }
    # the OTLP exporters come through their meta package, which pins both to its own release
    for package, proven in PROVEN_RELEASES.items():
        named = package if package in requirements else package.rsplit("-proto-", 1)[0]
        specifier = requirements[named].specifier
        assert any(spec.operator == "<" for spec in specifier), f"{package}: no upper bound"
        assert specifier.contains(proven, prereleases=True), (package, str(specifier), proven)
        assert version(package) == proven, (package, version(package))


def test_every_patch_passes_its_check_and_auto_turns_them_all_on() -> None:
    assert shape_problem() is None
    for patch in PATCHES:
        assert patch.check() is None, patch.name
        assert patch.replaces and re.fullmatch(r"[a-z_]+", patch.name)
    assert choose("auto").patches == {patch.name for patch in PATCHES}
    assert not choose("off")
    off = choose("auto", {"OTEL_NUMA_FAST_PATH_PATCHES_OFF": "rendered_families, shared_collection"})
    assert off.patches == {
        "forget_departed",
        "slim_series",
        "repeated_points",
        "reused_translations",
        "reused_requests",
    }


def test_a_patch_serves_only_with_the_patches_it_requires() -> None:
    names = [patch.name for patch in PATCHES]
    for patch in PATCHES:
        assert all(names.index(required) < names.index(patch.name) for required in patch.requires)
    assert PATCHES[names.index("rendered_families")].requires == ("reused_translations",)
    off = choose("auto", {"OTEL_NUMA_FAST_PATH_PATCHES_OFF": "reused_translations"})
    assert "reused_translations" not in off.patches and "rendered_families" not in off.patches
    assert off.patches == set(names) - {"reused_translations", "rendered_families"}


def test_the_janitor_finds_the_sdk_shape_it_needs_and_forgets_only_departed_pods() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
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
    provider = MeterProvider(metric_readers=[fast, plain], shutdown_on_exit=False)
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
    from otel_numa.export.fast.reused_translations import reuse_translations

    collector = reader._collector
    exporters_own = collector._translate_metric
    translated: list[str] = []
    collecting = False

    def recorded(metric: Any, *args: Any, **kwargs: Any) -> None:
        if collecting:
            translated.append(metric.name)
        exporters_own(metric, *args, **kwargs)

    collector._translate_metric = recorded
    reuse_translations(reader)
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


@pytest.mark.parametrize("series_per_slice", [128, 5])
def test_pages_with_new_values_written_in_are_the_libraries_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, series_per_slice: int
) -> None:
    """The page app of a node whose per-container values change every round, and then loses a pod, is
    byte for byte what prometheus_client writes, in both formats: families with the same series get their
    new values written into the previous text, families with other series are rendered again, a slice of
    series at a time (with 5, the per-container families span several slices)."""
    from prometheus_client.exposition import choose_encoder

    from otel_numa.export.fast import rendered_families, reused_translations
    from otel_numa.export.pipeline import build_pipeline
    from otel_numa.testing.wsgi import call_wsgi

    monkeypatch.setattr(reused_translations, "SERIES_PER_SLICE", series_per_slice)
    sliced = calls_to(monkeypatch, reused_translations, "_sample_lines")  # the slices after a family's first
    written_in = calls_to(monkeypatch, rendered_families, "_with_new_values")  # (known, values, ...)
    for accept in ("application/openmetrics-text; version=1.0.0", "text/plain; version=0.0.4"):
        encoder, _content_type = choose_encoder(accept)
        # no health series: their ages move between the two collections compared
        node, agent = small_node(tmp_path / str(len(accept)), disable="health")
        pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
        assert pipeline.registry is not None and pipeline.fast_path.on("rendered_families")
        app = pipeline.page_app()
        pages: list[bytes] = []
        written_in.clear()
        for generation in generations(node, agent):
            _status, _headers, page = call_wsgi(app, accept=accept)
            assert page == encoder(pipeline.registry), generation
            assert b"numa_container_memory_usage_bytes{" in page
            pages.append(page)
        assert pages[1] != pages[2] != pages[3] != pages[4]
        # the families' names, from the "# HELP <name> ..." line their text starts with
        assert b"numa_container_memory_usage_bytes" in {call[0].text.split(b" ")[2] for call in written_in}
        assert bool(sliced) is (series_per_slice == 5)
        pipeline.shutdown(timeout_s=1)


def test_scrapers_asking_for_different_formats_each_get_the_text_kept_for_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two scrapers that ask for the text format and OpenMetrics in turn get the libraries' pages, and
    once each format was rendered, neither makes a family's text anew while the series stay the same."""
    from prometheus_client.exposition import choose_encoder

    from otel_numa.export.fast import rendered_families
    from otel_numa.export.pipeline import build_pipeline
    from otel_numa.testing.wsgi import call_wsgi

    rendered = calls_to(monkeypatch, rendered_families, "_rendered")
    _node, agent = small_node(tmp_path / "node", disable="health")
    pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    assert pipeline.registry is not None
    app = pipeline.page_app()
    made_per_round = []
    for _round in range(3):
        before = len(rendered)
        for accept in ("application/openmetrics-text; version=1.0.0", "text/plain; version=0.0.4"):
            encoder, _content_type = choose_encoder(accept)
            _status, _headers, page = call_wsgi(app, accept=accept)
            assert page == encoder(pipeline.registry)
        made_per_round.append(len(rendered) - before)
    assert made_per_round[0] > 10 and made_per_round[1:] == [0, 0]
    pipeline.shutdown(timeout_s=1)


def test_a_gzip_scrape_sends_the_kept_texts_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scraper asking for gzip gets the libraries' page in one gzip member, whose long families are
    their kept deflate segments byte for byte: a scrape of an unchanged page compresses no text of them
    again, and one after the counters moved compresses only the families with new values."""
    import gzip

    from prometheus_client.exposition import choose_encoder

    from otel_numa.export.fast import rendered_families
    from otel_numa.export.pipeline import build_pipeline
    from otel_numa.gzip_stream import Segment

    kept = calls_to(monkeypatch, rendered_families, "_kept")  # every family text made or changed
    streams = calls_to(monkeypatch, rendered_families, "gzip_stream")
    node, agent = small_node(tmp_path / "node", disable="health")
    pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    assert pipeline.registry is not None
    app = pipeline.page_app()

    def scrape(accept: str) -> bytes:
        answer: list[Any] = []
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": ""}
        environ |= {"HTTP_ACCEPT": accept, "HTTP_ACCEPT_ENCODING": "gzip, deflate"}
        body = b"".join(app(environ, lambda status, headers, exc_info=None: answer.append(dict(headers))))
        assert answer[0]["Content-Encoding"] == "gzip"
        return body

    formats = ("application/openmetrics-text; version=1.0.0", "text/plain; version=0.0.4")
    for round_ in range(3):
        if round_ == 2:
            node.write_cgroup_usage(1)
            agent.refresh_background()
        made = len(kept)
        for accept in formats:
            body = scrape(accept)
            assert gzip.decompress(body) == choose_encoder(accept)[0](pipeline.registry)
            segments = [part for part in streams[-1][0] if isinstance(part, Segment)]
            assert len(segments) >= 3 and all(segment.deflated in body for segment in segments)
        if round_ == 1:
            assert len(kept) == made  # nothing compressed anew
        if round_ == 2:
            changed = {text.split(b" ")[2] for (text,) in kept[made:]}  # "# HELP <name> ..."
            assert b"numa_container_memory_usage_bytes" in changed
            assert b"numa_cpu_capacity" not in changed
    pipeline.shutdown(timeout_s=1)


def test_no_private_name_of_the_libraries_is_imported_when_a_module_is_imported() -> None:
    """Module-level imports of the package name no private module or name of the OpenTelemetry packages or
    prometheus_client (a renamed one would stop the agent at start-up), and outside the patches
    (otel_numa/export/fast/) no private module or name of theirs is imported at all."""
    import ast

    libraries = ("opentelemetry", "prometheus_client")
    package = REPO / "otel_numa"
    found = []
    for path in sorted(package.rglob("*.py")):
        if "proto" in path.parts or "testing" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        in_patch = path.parent.name == "fast"
        nodes = tree.body if in_patch else list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(libraries):
                names = [node.module or "", *(alias.name for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith(libraries)]
            else:
                continue
            if any(part.startswith("_") for name in names for part in name.split(".")):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def test_unchanged_instruments_repeat_their_points_and_give_the_sdks_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the page's reader the only one, instruments whose inputs did not change repeat their last
    points (no Measurement, no aggregation); the page is the public path's all along."""
    from prometheus_client import generate_latest

    from otel_numa.export.fast import PUBLIC
    from otel_numa.export.fast import repeated_points as module
    from otel_numa.export.pipeline import build_pipeline

    repeated = calls_to(monkeypatch, module._Collected, "points")
    node, agent = small_node(tmp_path / "node", disable="health")
    fast = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    public = build_pipeline(agent.options, agent.store, exporters=("prometheus",), fast_path=PUBLIC)
    assert fast.fast_path.on("repeated_points") and fast.registry and public.registry
    per_generation = []
    for generation in generations(node, agent):
        repeated.clear()
        assert generate_latest(fast.registry) == generate_latest(public.registry), generation
        fast.forget_departed(agent.background.live_pods())
        public.forget_departed(agent.background.live_pods())
        per_generation.append(len(repeated))
    # the first collection makes every point; later ones repeat the instruments whose inputs stayed
    assert per_generation[0] == 0 and per_generation[1] > 10
    assert min(per_generation[1:]) > 0
    fast.shutdown(timeout_s=1)
    public.shutdown(timeout_s=1)


def test_the_ledger_lists_every_patch_with_its_private_names_and_gains_on_both_nodes() -> None:
    ledger = (REPO / "docs" / "patches.md").read_text()
    sections = re.findall(r"^## `(\w+)`$", ledger, flags=re.MULTILINE)
    assert sections == [patch.name for patch in PATCHES]
    for patch in PATCHES:
        section = ledger.split(f"## `{patch.name}`")[1].split("\n## ")[0]
        assert all(f"`{name}`" in section for name in patch.private_names), patch.name
        for node in ("2x32", "8x48"):
            for measure in ("in order", "left out"):
                row = rf"^\| {node} \| {measure} \| [+-]\d+% \| [+-]\d+% \| [+-]\d+% \|$"
                assert re.search(row, section, flags=re.MULTILINE), (patch.name, node, measure)
        for required in patch.requires:
            assert f"Requires: `{required}`" in section, patch.name


def test_the_agents_series_are_kept_slotted_by_its_own_mappings_and_give_the_sdks_page(
    tmp_path: Path,
) -> None:
    """On the accelerated path every series of the agent's instruments, through churn and new values, is
    kept in a slotted aggregation keyed by the agent's own attribute mapping (the sums new in one
    collection with one start time); the page is the public path's all along."""
    from prometheus_client import generate_latest

    from otel_numa.export.fast import PUBLIC
    from otel_numa.export.fast.slim_series import ObservedLastValue, ObservedSum
    from otel_numa.export.pipeline import build_pipeline
    from otel_numa.series_attributes import SeriesAttributes

    node, agent = small_node(tmp_path / "node", disable="health")
    fast = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
    public = build_pipeline(agent.options, agent.store, exporters=("prometheus",), fast_path=PUBLIC)
    assert fast.fast_path.on("slim_series") and fast.registry and public.registry
    for generation in generations(node, agent):
        assert generate_latest(fast.registry) == generate_latest(public.registry), generation
        fast.forget_departed(agent.background.live_pods())
        public.forget_departed(agent.background.live_pods())
    kinds: dict[str, int] = {}
    starts: set[int] = set()  # the start time objects of the sum series
    storages = fast.meter_provider._measurement_consumer._reader_storages.values()
    for storage in storages:
        for matches in storage._instrument_view_instrument_matches.values():
            for match in matches:
                for key, aggregation in match._attributes_aggregation.items():
                    if not aggregation._attributes:
                        continue  # a series without attributes: the SDK's own
                    assert type(key) is SeriesAttributes and aggregation._attributes == key
                    kinds[type(aggregation).__name__] = kinds.get(type(aggregation).__name__, 0) + 1
                    if isinstance(aggregation, ObservedSum):
                        starts.add(id(aggregation._start))
    assert set(kinds) == {ObservedSum.__name__, ObservedLastValue.__name__}
    # the sum series an instrument made new in one collection share one start time
    assert len(starts) * 5 < kinds[ObservedSum.__name__]
    assert sum(kinds.values()) > 100
    fast.shutdown(timeout_s=1)
    public.shutdown(timeout_s=1)


def test_a_non_finite_value_on_the_accelerated_path_is_dropped_and_logged_by_the_sdk(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An observation the SDK refuses goes through the SDK's own loop: the same warning, the same points."""
    import math

    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter

    from otel_numa.export.fast.slim_series import slim_series
    from otel_numa.instruments.observations import Observations
    from otel_numa.series_attributes import series_attributes

    reservoir = object()
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader], shutdown_on_exit=False, exemplar_filter=AlwaysOffExemplarFilter()
    )
    x, y = series_attributes({"a": "x"}), series_attributes({"a": "y"})
    provider.get_meter("test").create_observable_gauge(
        "g", callbacks=[lambda _options: Observations([1.5, math.inf], (x, y))]
    )
    assert slim_series(provider, reservoir)
    with caplog.at_level("WARNING"):
        data = reader.get_metrics_data()
    assert data is not None
    points = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert [(dict(point.attributes or {}), getattr(point, "value", None)) for point in points] == [
        ({"a": "x"}, 1.5)
    ]
    assert any("non-finite value inf" in record.getMessage() for record in caplog.records)
    provider.shutdown()
