"""The generated protobuf modules: reproducible, and on the wire identical to the published APIs.

The expected names, field numbers and bytes below are written by hand from the published
definitions (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, k8s.io/cri-api/pkg/apis/runtime/v1/
api.proto) and from the protobuf encoding rules, not read from the generated code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor

from otel_numa.proto import cri_runtime_v1_pb2 as cri
from otel_numa.proto import cri_runtime_v1_pb2_grpc as cri_grpc
from otel_numa.proto import podresources_v1_pb2 as podresources
from otel_numa.proto import podresources_v1_pb2_grpc as podresources_grpc
from tests.support import REPO

PROTO_DIR = REPO / "otel_numa" / "proto"
GEN_SCRIPT = REPO / "scripts" / "gen_protos.sh"

MODULES = [
    "podresources_v1_pb2.py",
    "podresources_v1_pb2_grpc.py",
    "cri_runtime_v1_pb2.py",
    "cri_runtime_v1_pb2_grpc.py",
]
STUBS = [
    "podresources_v1_pb2.pyi",
    "podresources_v1_pb2_grpc.pyi",
    "cri_runtime_v1_pb2.pyi",
    "cri_runtime_v1_pb2_grpc.pyi",
]


def _mypy_protobuf_available() -> bool:
    """The generator looks next to the interpreter, then on PATH."""
    beside_python = Path(sys.executable).parent / "protoc-gen-mypy"
    return beside_python.exists() or shutil.which("protoc-gen-mypy") is not None


def _regenerate(output_root: Path, *extra_args: str) -> Path:
    subprocess.run(
        ["bash", str(GEN_SCRIPT), *extra_args, str(output_root)],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=120,
    )
    return output_root / "otel_numa" / "proto"


def test_regenerated_modules_are_identical(tmp_path: Path) -> None:
    generated = _regenerate(tmp_path, "--without-stubs")
    assert sorted(path.name for path in generated.iterdir()) == sorted(MODULES)
    for name in MODULES:
        assert (generated / name).read_bytes() == (PROTO_DIR / name).read_bytes(), f"{name} is stale"


@pytest.mark.skipif(not _mypy_protobuf_available(), reason="mypy-protobuf (protoc-gen-mypy) is not installed")
def test_regenerated_stubs_are_identical(tmp_path: Path) -> None:
    generated = _regenerate(tmp_path)
    for name in MODULES + STUBS:
        assert (generated / name).read_bytes() == (PROTO_DIR / name).read_bytes(), f"{name} is stale"


def _fields(file: FileDescriptor, message: str) -> dict[str, tuple[int, int, bool]]:
    descriptor = file.message_types_by_name[message]
    return {field.name: (field.number, field.type, field.is_repeated) for field in descriptor.fields}


STRING = FieldDescriptor.TYPE_STRING
INT64 = FieldDescriptor.TYPE_INT64
UINT64 = FieldDescriptor.TYPE_UINT64
UINT32 = FieldDescriptor.TYPE_UINT32
BOOL = FieldDescriptor.TYPE_BOOL
MESSAGE = FieldDescriptor.TYPE_MESSAGE
ENUM = FieldDescriptor.TYPE_ENUM


def test_podresources_messages_match_the_published_api() -> None:
    file = podresources.DESCRIPTOR
    assert file.package == "v1"
    assert _fields(file, "ListPodResourcesResponse") == {"pod_resources": (1, MESSAGE, True)}
    assert _fields(file, "PodResources") == {
        "name": (1, STRING, False),
        "namespace": (2, STRING, False),
        "containers": (3, MESSAGE, True),
        "cpu_ids": (4, INT64, True),
        "memory": (5, MESSAGE, True),
    }
    assert _fields(file, "ContainerResources") == {
        "name": (1, STRING, False),
        "devices": (2, MESSAGE, True),
        "cpu_ids": (3, INT64, True),
        "memory": (4, MESSAGE, True),
        "dynamic_resources": (5, MESSAGE, True),
    }
    # field 1 (class_name) of DynamicResource was removed from the published API
    assert _fields(file, "DynamicResource") == {
        "claim_name": (2, STRING, False),
        "claim_namespace": (3, STRING, False),
        "claim_resources": (4, MESSAGE, True),
    }
    assert _fields(file, "ClaimResource") == {
        "cdi_devices": (1, MESSAGE, True),
        "driver_name": (2, STRING, False),
        "pool_name": (3, STRING, False),
        "device_name": (4, STRING, False),
        "share_id": (5, STRING, False),
    }
    assert file.message_types_by_name["ClaimResource"].fields_by_name["share_id"].has_presence  # optional
    assert _fields(file, "CDIDevice") == {"name": (1, STRING, False)}
    assert _fields(file, "GetPodResourcesRequest") == {
        "pod_name": (1, STRING, False),
        "pod_namespace": (2, STRING, False),
    }
    assert _fields(file, "GetPodResourcesResponse") == {"pod_resources": (1, MESSAGE, False)}
    assert _fields(file, "ContainerDevices") == {
        "resource_name": (1, STRING, False),
        "device_ids": (2, STRING, True),
        "topology": (3, MESSAGE, False),
    }
    assert _fields(file, "ContainerMemory") == {
        "memory_type": (1, STRING, False),
        "size": (2, UINT64, False),
        "topology": (3, MESSAGE, False),
    }
    assert _fields(file, "TopologyInfo") == {"nodes": (1, MESSAGE, True)}
    assert _fields(file, "NUMANode") == {"ID": (1, INT64, False)}
    assert _fields(file, "AllocatableResourcesResponse") == {
        "devices": (1, MESSAGE, True),
        "cpu_ids": (2, INT64, True),
        "memory": (3, MESSAGE, True),
    }


def test_cri_messages_match_the_published_api() -> None:
    file = cri.DESCRIPTOR
    assert file.package == "runtime.v1"
    assert _fields(file, "PodSandboxMetadata") == {
        "name": (1, STRING, False),
        "uid": (2, STRING, False),
        "namespace": (3, STRING, False),
        "attempt": (4, UINT32, False),
    }
    sandbox = _fields(file, "PodSandbox")
    assert {name: sandbox[name][0] for name in sandbox} == {
        "id": 1,
        "metadata": 2,
        "state": 3,
        "created_at": 4,
        "labels": 5,
        "annotations": 6,
        "runtime_handler": 7,
    }
    assert _fields(file, "ListPodSandboxResponse") == {"items": (1, MESSAGE, True)}
    container = _fields(file, "Container")
    assert {name: container[name][0] for name in container} == {
        "id": 1,
        "pod_sandbox_id": 2,
        "metadata": 3,
        "image": 4,
        "image_ref": 5,
        "state": 6,
        "created_at": 7,
        "labels": 8,
        "annotations": 9,
        "image_id": 10,
    }
    assert _fields(file, "ContainerFilter")["state"] == (2, MESSAGE, False)
    assert _fields(file, "ContainerFilter")["pod_sandbox_id"] == (3, STRING, False)
    assert _fields(file, "ContainerStatusRequest") == {
        "container_id": (1, STRING, False),
        "verbose": (2, BOOL, False),
    }
    assert _fields(file, "ContainerStatusResponse") == {
        "status": (1, MESSAGE, False),
        "info": (2, MESSAGE, True),
    }
    assert _fields(file, "PodSandboxStatusRequest") == {
        "pod_sandbox_id": (1, STRING, False),
        "verbose": (2, BOOL, False),
    }
    assert _fields(file, "PodSandboxStatus")["labels"][0] == 7
    assert _fields(file, "PodSandboxStatus")["annotations"][0] == 8
    assert _fields(file, "ContainerStatus")["log_path"][0] == 15
    assert _fields(file, "ImageSpec")["user_specified_image"][0] == 18
    assert {value.name: value.number for value in file.enum_types_by_name["ContainerState"].values} == {
        "CONTAINER_CREATED": 0,
        "CONTAINER_RUNNING": 1,
        "CONTAINER_EXITED": 2,
        "CONTAINER_UNKNOWN": 3,
    }
    assert {value.name: value.number for value in file.enum_types_by_name["PodSandboxState"].values} == {
        "SANDBOX_READY": 0,
        "SANDBOX_NOTREADY": 1,
    }


class _RecordingChannel:
    """Records the :path each stub method is bound to."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def unary_unary(self, path: str, **_: object) -> None:
        self.paths.append(path)


def test_stubs_call_the_published_paths() -> None:
    channel = _RecordingChannel()
    podresources_grpc.PodResourcesListerStub(channel)
    assert channel.paths == [
        "/v1.PodResourcesLister/List",
        "/v1.PodResourcesLister/GetAllocatableResources",
        "/v1.PodResourcesLister/Get",
    ]

    channel = _RecordingChannel()
    cri_grpc.RuntimeServiceStub(channel)
    assert sorted(channel.paths) == [
        "/runtime.v1.RuntimeService/ContainerStatus",
        "/runtime.v1.RuntimeService/ListContainers",
        "/runtime.v1.RuntimeService/ListPodSandbox",
        "/runtime.v1.RuntimeService/PodSandboxStatus",
    ]


def test_hand_encoded_dynamic_resource_decodes() -> None:
    # ContainerResources field 5 (dynamic_resources): 0x2a, len 24 { field 2 claim_name: 0x12 len 3 "gpu";
    #   field 4 claim_resources: 0x22 len 17 { field 2 driver_name: 0x12 len 3 "drv"; field 4
    #   device_name: 0x22 len 2 "d0"; field 5 share_id: 0x2a len 1 "s";
    #   field 1 cdi_devices: 0x0a len 3 { field 1 name: 0x0a len 1 "x" } } }
    claim_resource = b"\x12\x03drv" + b"\x22\x02d0" + b"\x2a\x01s" + b"\x0a\x03\x0a\x01x"
    dynamic = b"\x12\x03gpu" + b"\x22" + bytes([len(claim_resource)]) + claim_resource
    assert (len(claim_resource), len(dynamic)) == (17, 24)
    wire = b"\x0a\x03app" + b"\x2a" + bytes([len(dynamic)]) + dynamic
    decoded = podresources.ContainerResources.FromString(wire)
    (claim,) = decoded.dynamic_resources
    assert claim.claim_name == "gpu"
    (resource,) = claim.claim_resources
    assert (resource.driver_name, resource.device_name, resource.share_id) == ("drv", "d0", "s")
    assert [cdi.name for cdi in resource.cdi_devices] == ["x"]


def test_hand_encoded_container_resources_decode() -> None:
    # field 1 (name, length-delimited): 0x0a, len 3, "app"
    # field 3 (cpu_ids, packed varints): 0x1a, len 2, 3, 4
    # field 2 (devices): 0x12, len 11 { field 1: 0x0a len 3 "gpu"; field 3 topology: 0x1a len 4
    #   { field 1 nodes: 0x0a len 2 { field 1 ID: 0x08 0x01 } } }
    wire = b"\x0a\x03app" + b"\x1a\x02\x03\x04" + b"\x12\x0b\x0a\x03gpu\x1a\x04\x0a\x02\x08\x01"
    decoded = podresources.ContainerResources.FromString(wire)
    assert decoded.name == "app"
    assert list(decoded.cpu_ids) == [3, 4]
    assert decoded.devices[0].resource_name == "gpu"
    assert [node.ID for node in decoded.devices[0].topology.nodes] == [1]


def test_hand_encoded_container_status_request() -> None:
    # field 1 (container_id): 0x0a, len 3, "abc"; field 2 (verbose, varint): 0x10, 1
    request = cri.ContainerStatusRequest(container_id="abc", verbose=True)
    assert request.SerializeToString() == b"\x0a\x03abc\x10\x01"
