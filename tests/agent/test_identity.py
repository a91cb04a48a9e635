"""Unchanged inputs, identical objects (otel_numa/snapshot/identity.py): every part of the snapshot an
instrument depends on is the last snapshot's object while its value is the same, whatever a collector hands
back, and every instrument then hands the SDK the very observations it handed last time."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.instruments import observers, register_instruments
from otel_numa.snapshot import builder
from otel_numa.snapshot.store import Snapshot
from otel_numa.testing.device_tree import add_pci_function
from otel_numa.testing.large_node import LargeNode, LargeNodeSpec, write_large_node

MACHINE_PARTS = ("topology", "memory", "hugepages", "numastat", "cpu_time", "pci")


@pytest.fixture
def node(tmp_path: Path) -> LargeNode:
    spec = LargeNodeSpec(
        numa_nodes=2,
        cpus_per_node=8,
        mem_per_node_kib=4 << 20,
        hugepage_sizes_kib=(2048,),
        pods=4,
        containers_per_pod=2,
        devices_per_resource=2,
        exclusive_pod_every=2,
    )
    node = write_large_node(tmp_path / "node", spec)
    add_pci_function(node.sysfs_root, "0000:3b:00.0", "0x020000", numa_node="1")
    return node


def parts(snapshot: Snapshot) -> dict[str, object]:
    assert snapshot.machine is not None
    found: dict[str, object] = {name: getattr(snapshot.machine, name) for name in MACHINE_PARTS}
    found.update(allocation=snapshot.allocation, container_usage=snapshot.container_usage)
    return found


def assert_identical(first: Snapshot, second: Snapshot) -> None:
    before, after = parts(first), parts(second)
    assert after == before  # the values
    for name, value in after.items():
        assert value is before[name], f"{name} is an equal new object"


def test_unchanged_inputs_give_the_last_snapshots_objects(node: LargeNode) -> None:
    agent = Agent(Settings(**node.settings_values()).to_options())  # type: ignore[arg-type]
    agent.refresh_background()
    first = agent.store.refresh()
    assert first.container_usage and first.allocation.containers and first.machine is not None
    agent.refresh_background()  # the cgroup walk and every file read again, nothing changed
    assert_identical(first, agent.store.refresh())


def test_an_equal_new_object_from_a_collector_is_replaced_by_the_last_one(
    node: LargeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage (here the allocation) that hands back an equal copy costs the instruments nothing."""
    real = builder.SnapshotBuilder._allocate

    def copied(self: builder.SnapshotBuilder, machine: Any) -> Any:
        kubelet, allocation = real(self, machine)
        return kubelet, copy.deepcopy(allocation)

    monkeypatch.setattr(builder.SnapshotBuilder, "_allocate", copied)
    agent = Agent(Settings(**node.settings_values()).to_options())  # type: ignore[arg-type]
    agent.refresh_background()
    first = agent.store.refresh()
    second = agent.store.refresh()
    assert_identical(first, second)


def test_a_changed_part_is_a_new_object_and_the_others_stay(node: LargeNode) -> None:
    agent = Agent(Settings(**node.settings_values()).to_options())  # type: ignore[arg-type]
    agent.refresh_background()
    first = agent.store.refresh()
    node.write_cgroup_usage(1)
    agent.refresh_background()
    second = agent.store.refresh()
    changed = {name for name, value in parts(second).items() if value is not parts(first)[name]}
    assert changed == {"container_usage"}


class RecordingMeter:
    """A real SDK meter that also keeps each observable instrument's callbacks, by name."""

    def __init__(self) -> None:
        self.meter = MeterProvider().get_meter("identity")
        self.callbacks: dict[str, Callable[[CallbackOptions], Iterable[Observation]]] = {}

    def __getattr__(self, name: str) -> Any:
        create = getattr(self.meter, name)

        def recorded(instrument: str, callbacks: list[Any], **kwargs: Any) -> Any:
            self.callbacks[instrument] = callbacks[0]
            return create(instrument, callbacks=callbacks, **kwargs)

        return recorded


def test_every_instrument_hands_back_its_last_observations_while_its_part_is_unchanged(
    node: LargeNode,
) -> None:
    agent = Agent(Settings(**node.settings_values()).to_options())  # type: ignore[arg-type]
    meter = RecordingMeter()
    register_instruments(meter, agent.store, agent.options.metrics, "n")  # type: ignore[arg-type]
    with_parts = {name for name, (_observe, part) in observers("n").items() if part is not None}
    assert {"numa.cpu.allocated", "numa.memory.capacity", "numa.container.memory.usage"} <= with_parts
    agent.refresh_background()

    def collect() -> dict[str, Iterable[Observation]]:
        with agent.store.pinned():
            return {name: callback(CallbackOptions()) for name, callback in meter.callbacks.items()}

    first = collect()
    agent.refresh_background()
    second = collect()
    checked = 0
    for name in sorted(with_parts & set(meter.callbacks)):
        if list(first[name]):  # a metric with no series here (allocatable: no reserved CPUs) is not looked at
            assert second[name] is first[name], name
            checked += 1
    assert checked >= 20
