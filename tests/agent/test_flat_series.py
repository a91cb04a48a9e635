"""Every series the agent observes is one flat attribute tuple (``SeriesAttributes``) of plain strings and
integers, on a node with pods, devices, cgroups, the numainfo compat series and the export series. A value
of another type (an enum member is a ``str`` subclass) leaves the series a dict, which the accelerated path
hands to the SDK's own loop to copy, clean and hash at every collection, or a tuple that breaks the series
makers' contract: the page and the pushes stay right, only slower, so no other test sees it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

from opentelemetry.metrics import CallbackOptions, Observation

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.export.otlp_deadline import FAILED, PushRecord
from otel_numa.instruments import register_instruments
from otel_numa.instruments.observations import Observations
from otel_numa.series_attributes import SeriesAttributes
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node

Callback = Callable[[CallbackOptions], Iterable[Observation]]


class NamingMeter:
    """Keeps each instrument's callbacks by its name (the SDK's meter would call them)."""

    def __init__(self) -> None:
        self.callbacks: dict[str, Callback] = {}

    def create_observable_gauge(self, name: str, callbacks: list[Callback], **_kwargs: Any) -> None:
        (self.callbacks[name],) = callbacks

    create_observable_up_down_counter = create_observable_gauge
    create_observable_counter = create_observable_gauge


def test_every_series_of_every_metric_is_a_flat_tuple(tmp_path: Path) -> None:
    spec = LargeNodeSpec(numa_nodes=2, cpus_per_node=8, pods=6, containers_per_pod=2, devices_per_resource=2)
    node = write_large_node(tmp_path, spec)
    settings = Settings(**node.settings_values(), compat="numainfo")  # type: ignore[arg-type]
    agent = Agent(settings.to_options())
    try:
        agent.refresh_background()
        meter = NamingMeter()
        options, pushes = agent.options, PushRecord("http://collector:4317")
        pushes.failed(FAILED, 0.5)
        pushes.accepted(0.25)
        register_instruments(
            cast(Any, meter), agent.store, options.metrics, options.node_name, fast_path=True, pushes=pushes
        )
        with agent.store.pinned():
            observed = {name: callback(CallbackOptions()) for name, callback in meter.callbacks.items()}
    finally:
        agent.close()
    kinds: dict[str, set[str]] = {}
    for name, made in observed.items():
        assert isinstance(made, Observations), name
        if made.attributes:
            kinds[name] = {type(attributes).__name__ for attributes in made.attributes}
            kinds[name] |= {
                type(value).__name__
                for attributes in made.attributes
                for value in attributes.values()
                if type(value) not in (str, int)  # exactly: an enum member or a bool is neither
            }
    assert {name: kind for name, kind in kinds.items() if kind != {SeriesAttributes.__name__}} == {}
    for expected in (
        "numa.cpu.time",
        "numa.container.memory.usage",
        "numa.device.allocated",
        "numa.agent.source.errors",
        "numa.agent.export.failures",
        "numainfo_core_count",
    ):
        assert expected in kinds, f"{expected} observed no series on this node"
