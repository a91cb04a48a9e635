"""CDI specs within their budgets, and each spec file parsed again only when its own stat changes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from otel_numa.snapshot.collectors import cdi_specs
from otel_numa.snapshot.collectors.cdi_specs import CdiSpecs
from otel_numa.sources.bounded_documents import load_yaml
from otel_numa.sources.cdi import (
    MAX_DEVICE_NODES,
    MAX_DEVICES,
    MAX_SPEC_NODES,
    CdiDevice,
    CdiDeviceNode,
    parse_cdi_spec,
    read_cdi_spec,
)
from otel_numa.sources.errors import SourceCorrupt, SourceError
from otel_numa.testing.device_tree import cdi_spec, write_cdi_spec
from otel_numa.testing.hostile_cdi import aliased_spec, laughing_spec

# shaped as kubernetes-sigs/dra-driver-cpu writes its one spec: a device per claim, its cpuset in the env
CPU_DRIVER_SPEC = {
    "cdiVersion": "0.8.0",
    "kind": "dra.k8s.io/cpu",
    "devices": [
        {"name": "claim-1", "containerEdits": {"env": ["DRA_CPUSET_6e1a27c2=2-5,34-37"]}},
        {"name": "claim-2", "containerEdits": {"env": ["DRA_CPUSET_8f03aa10=dynamic"]}},
    ],
}


def spec_error(data: bytes, name: str = "spec.yaml") -> SourceCorrupt:
    with pytest.raises(SourceCorrupt) as caught:
        parse_cdi_spec(data, Path(name))
    return caught.value


def test_a_cpu_drivers_spec_keeps_each_claims_env(tmp_path: Path) -> None:
    spec = parse_cdi_spec(json.dumps(CPU_DRIVER_SPEC).encode(), tmp_path / "dra.cpu.json")
    assert [(device.name, device.device_nodes, device.env) for device in spec.devices] == [
        ("dra.k8s.io/cpu=claim-1", (), ("DRA_CPUSET_6e1a27c2=2-5,34-37",)),
        ("dra.k8s.io/cpu=claim-2", (), ("DRA_CPUSET_8f03aa10=dynamic",)),
    ]


def test_json_and_yaml_are_told_by_content_not_suffix(tmp_path: Path) -> None:
    as_json = json.dumps(CPU_DRIVER_SPEC).encode()
    as_yaml = b"cdiVersion: 0.8.0\nkind: dra.k8s.io/cpu\ndevices:\n- name: claim-1\n"
    flow_yaml = b"{cdiVersion: 0.8.0, kind: dra.k8s.io/cpu, devices: [{name: claim-1}]}"
    for data, name in ((as_json, "a.yaml"), (as_yaml, "a.json"), (flow_yaml, "a.yaml")):
        assert parse_cdi_spec(data, tmp_path / name).devices[0].name == "dra.k8s.io/cpu=claim-1"
    assert spec_error(b'{"cdiVersion": ', "a.json").error_type == "parse_error"


def test_yaml_scalars_keep_their_types() -> None:
    spec = parse_cdi_spec(
        b"cdiVersion: '0.6.0'\nkind: a.com/b\ndevices:\n"
        b"- name: d\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/x, major: 0x1f, minor: 7}\n",
        Path("s.yaml"),
    )
    assert spec.devices[0].device_nodes == (CdiDeviceNode("/dev/x", None, None, 31, 7),)
    # an unquoted 0.6 is a number, not the version string the spec needs
    assert spec_error(b"cdiVersion: 0.6\nkind: a.com/b\ndevices: []\n").error_type == "invalid_spec"
    assert spec_error(b"cdiVersion: !!python/name:os.system ''\n").error_type == "parse_error"
    assert spec_error(b"a: 1\n---\nb: 2\n").error_type == "parse_error"


def test_anchors_aliases_and_merge_keys_as_yaml_means_them() -> None:
    spec = parse_cdi_spec(
        b"cdiVersion: 0.6.0\nkind: a.com/b\n"
        b"x-edits: &edits {deviceNodes: [{path: /dev/a}], env: [A=1]}\n"
        b"devices:\n- {name: one, containerEdits: *edits}\n"
        b"- {name: two, containerEdits: {<<: *edits, env: [B=2]}}\n",
        Path("s.yaml"),
    )
    assert spec.devices == (
        CdiDevice("a.com/b=one", (CdiDeviceNode("/dev/a"),), ("A=1",)),
        CdiDevice("a.com/b=two", (CdiDeviceNode("/dev/a"),), ("B=2",)),
    )


def test_aliases_count_as_what_they_expand_to() -> None:
    """A billion laughs of 0.5 KB (nine levels of nine aliases) is refused at the alias that crosses the
    budget: never expanded, never walked."""
    with pytest.raises(SourceCorrupt) as caught:
        load_yaml(laughing_spec(levels=9, width=9), MAX_SPEC_NODES, "laughs.yaml")
    assert caught.value.error_type == "over_limit"
    assert str(caught.value) == f"laughs.yaml: more than {MAX_SPEC_NODES} YAML nodes (aliases expanded)"


def test_many_devices_sharing_one_aliased_list_are_refused() -> None:
    """20,000 devices sharing one anchored list of 5,000 device nodes: refused at the alias that crosses the
    budget, though the file holds ~20,000 nodes."""
    assert spec_error(aliased_spec(devices=20_000, nodes=5_000)).error_type == "over_limit"


def test_per_spec_caps_on_devices_and_device_nodes() -> None:
    many_devices = cdi_spec("a.com/b", {f"d{index}": [] for index in range(MAX_DEVICES + 1)})
    assert spec_error(json.dumps(many_devices).encode(), "s.json").error_type == "over_limit"
    nodes = [{"path": f"/dev/x{index}"} for index in range(MAX_DEVICE_NODES // 2 + 1)]
    two_devices = cdi_spec("a.com/b", {"d0": nodes, "d1": nodes})
    error = spec_error(json.dumps(two_devices).encode(), "s.json")
    assert (error.error_type, str(error)) == (
        "over_limit",
        f"s.json: more than {MAX_DEVICE_NODES} device nodes",
    )


def test_json_past_its_node_budget_is_refused_before_it_is_parsed() -> None:
    data = (
        b'{"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [], "x": [' + b"1," * MAX_SPEC_NODES + b"1]}"
    )
    assert spec_error(data, "s.json").error_type == "over_limit"


def test_deep_nesting_is_refused() -> None:
    assert spec_error(b"a: " + b"[" * 100 + b"]" * 100).error_type == "over_limit"


def test_a_spec_over_its_byte_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "wb") as file:
        file.truncate(1 << 30)  # sparse: costs nothing to make, and must cost nothing to refuse
    with pytest.raises(SourceCorrupt) as caught:
        read_cdi_spec(path)
    assert caught.value.error_type == "too_large"


# --- parsed again only when the file changed -------------------------------------------------------


class Clock:
    """Nanoseconds, two seconds after the wall clock by default: the files written now are out of their
    racy second."""

    def __init__(self) -> None:
        self.ahead_ns = 2_000_000_000

    def __call__(self) -> int:
        return time.time_ns() + self.ahead_ns


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths parsed, in order."""
    parsed: list[Path] = []

    def counted(path: Path) -> object:
        parsed.append(path)
        return read_cdi_spec(path)

    monkeypatch.setattr(cdi_specs, "read_cdi_spec", counted)
    return parsed


def gpu_spec(directory: Path, name: str, device: str, node: str = "/dev/gpu0") -> Path:
    return write_cdi_spec(directory, name, cdi_spec("example.com/gpu", {device: [{"path": node}]}))


def test_unchanged_and_rejected_files_are_not_parsed_again(tmp_path: Path, parses: list[Path]) -> None:
    good = gpu_spec(tmp_path, "good.json", "g0")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [\n")
    specs = CdiSpecs([tmp_path], Clock())
    for _ in range(5):
        errors: list[SourceError] = []
        devices = specs.read(errors)
        assert set(devices) == {"example.com/gpu=g0"}
        assert [error.error_type for error in errors] == ["parse_error"]  # counted every round
    assert sorted(parses) == [bad, good]
    bad.write_text("kind: [\n ")  # rewritten in place: its own stat changes
    specs.read([])
    assert parses[2:] == [bad]


def test_a_spec_edited_in_place_is_read_again(tmp_path: Path, parses: list[Path]) -> None:
    spec = gpu_spec(tmp_path, "gpu.json", "g0", "/dev/gpu0")
    clock = Clock()
    specs = CdiSpecs([tmp_path], clock)
    first = specs.read([])
    assert specs.read([]) is first
    directory_stat, before = os.stat(tmp_path), os.stat(spec)
    with open(spec, "r+b") as file:  # truncate and write: the directory does not change
        text = file.read().replace(b"/dev/gpu0", b"/dev/gpu7")
        file.seek(0)
        file.truncate()
        file.write(text)
    os.utime(spec, ns=(before.st_atime_ns, before.st_mtime_ns))  # as `cp -p` or `touch -r` leave it
    assert (os.stat(spec).st_ino, os.stat(spec).st_size) == (before.st_ino, before.st_size)
    assert os.stat(tmp_path).st_mtime_ns == directory_stat.st_mtime_ns
    assert specs.read([])["example.com/gpu=g0"].device_nodes == (CdiDeviceNode("/dev/gpu7"),)
    assert len(parses) == 2


def test_mtimes_in_the_future_do_not_make_files_look_new(tmp_path: Path, parses: list[Path]) -> None:
    spec = gpu_spec(tmp_path, "gpu.json", "g0")
    future = time.time_ns() + 10 * 365 * 86400 * 10**9
    for path in (spec, tmp_path):
        os.utime(path, ns=(future, future))
    specs = CdiSpecs([tmp_path], Clock())
    first = specs.read([])
    for _ in range(5):
        assert specs.read([]) is first
    assert parses == [spec]


def test_a_churning_claim_spec_is_the_only_file_parsed_again(tmp_path: Path, parses: list[Path]) -> None:
    """A driver adding and removing a claim's spec between every two rounds: each round parses that file
    (when it is there), never the others."""
    others = [gpu_spec(tmp_path, f"gpu-{index}.json", f"g{index}") for index in range(5)]
    specs = CdiSpecs([tmp_path], Clock())
    specs.read([])
    assert sorted(parses) == others
    churn = tmp_path / "claim.json"
    for round_ in range(10):
        if round_ % 2 == 0:
            gpu_spec(tmp_path, "claim.json", "claim")
        else:
            churn.unlink()
        assert ("example.com/gpu=claim" in specs.read([])) == (round_ % 2 == 0)
    assert parses[len(others) :] == [churn] * 5


def test_a_stat_taken_in_the_files_own_second_is_not_trusted(tmp_path: Path, parses: list[Path]) -> None:
    spec = gpu_spec(tmp_path, "gpu.json", "g0")
    clock = Clock()
    clock.ahead_ns = 0  # the file was written just now
    specs = CdiSpecs([tmp_path], clock)
    specs.read([])
    specs.read([])
    assert parses == [spec, spec]  # read again: a change in the same tick would not show
    clock.ahead_ns = 2_000_000_000
    specs.read([])
    specs.read([])
    assert parses == [spec, spec, spec]
