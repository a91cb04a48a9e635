"""What the DRA CPU and memory drivers leave on a node, for tests: their CDI specs, the kubelet's podresources
answer for their claims, and the ``dra_manager_state`` claims.

Written from the drivers' published sources, not from the agent's reader:

- kubernetes-sigs/dra-driver-cpu v0.2.0 (``pkg/driver/cdi.go``, ``pkg/driver/dra_hooks.go``,
  ``pkg/device/builder.go``; unchanged on its main branch at de98098): driver ``dra.cpu``; per claim a CDI
  spec written by the CDI library's ``WriteSpec`` (``json.Marshal``: compact, no final newline) to
  ``/var/run/cdi/dra.k8s.io-cpu_claim-<claim UID>.json``, kind ``dra.k8s.io/cpu``, CDI version 0.8.0, one
  device ``claim-<claim UID>`` with the env ``DRA_CPUSET_<claim UID>=<cpuset>``. Every allocated device of
  the claim is prepared with that one CDI device. Devices: ``cpudevNNN`` (individual mode, one per CPU,
  numbered over the cores' threads in order), ``cpudevnumaNNN`` / ``cpudevsocketNNN`` (grouped mode: one
  device per NUMA node or socket with a consumable CPU count, so each claim has a share of it).
- the DRA memory driver, github.com/ffromani/dra-driver-memory v0.1.6 (``pkg/cdi/cdi.go``,
  ``pkg/env/draenv.go``, ``pkg/driver/dra.go``): driver ``dra.memory``; one spec
  ``/var/run/cdi/dra.memory.json`` (``json.MarshalIndent`` with two blanks), kind ``dra.k8s.io/memory``, a
  device ``claim-<claim UID>`` per claim with ``DRAMEMORY_<claim UID>_<resource>=numanode:<id>,size:<size>``
  per resource and ``DRAMEMORY_<claim UID>_NUMANodes=<ids>``.

The value ``dynamic`` for ``DRA_CPUSET_`` (CPUs the driver may move) is the agent's contract for a CPU claim
whose cpuset only the cgroup knows; the releases above always write a cpuset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from otel_numa.model import DraClaim, DraDevice
from otel_numa.proto import podresources_v1_pb2 as pb

CPU_DRIVER = "dra.cpu"
MEMORY_DRIVER = "dra.memory"
CDI_VERSION = "0.8.0"


def cpu_cdi_device(claim_uid: str) -> str:
    """The fully qualified CDI device the CPU driver prepares for a claim."""
    return f"dra.k8s.io/cpu=claim-{claim_uid}"


def memory_cdi_device(claim_uid: str) -> str:
    return f"dra.k8s.io/memory=claim-{claim_uid}"


def cpu_spec_file_name(claim_uid: str) -> str:
    """``GenerateTransientSpecName("dra.k8s.io", "cpu", "claim-<uid>") + ".json"``."""
    return f"dra.k8s.io-cpu_claim-{claim_uid}.json"


def cpu_spec_bytes(claim_uid: str, cpuset: str) -> bytes:
    """The CPU driver's spec for one claim; ``cpuset`` as written (``4-5,68-69``, or ``dynamic``)."""
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": "dra.k8s.io/cpu",
        "devices": [
            {"name": f"claim-{claim_uid}", "containerEdits": {"env": [f"DRA_CPUSET_{claim_uid}={cpuset}"]}}
        ],
        "containerEdits": {},
    }
    return json.dumps(spec, separators=(",", ":")).encode()


def write_cpu_spec(cdi_dir: Path, claim_uid: str, cpuset: str) -> Path:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = cdi_dir / cpu_spec_file_name(claim_uid)
    path.write_bytes(cpu_spec_bytes(claim_uid, cpuset))
    return path


@dataclass(frozen=True)
class MemoryAllocation:
    """One resource of a memory claim: ``resource`` is ``memory`` or ``hugepages-2Mi``; ``size`` as the
    driver writes a quantity (``1Gi``)."""

    resource: str
    numa_node: int
    size: str


def memory_spec_bytes(claims: Sequence[tuple[str, Sequence[MemoryAllocation]]]) -> bytes:
    """The memory driver's one spec, with a device for each (claim UID, allocations)."""
    devices = []
    for claim_uid, allocations in claims:
        env = [
            f"DRAMEMORY_{claim_uid}_{a.resource.replace('-', '_')}=numanode:{a.numa_node},size:{a.size}"
            for a in allocations
        ]
        nodes = ",".join(str(node) for node in sorted({a.numa_node for a in allocations}))
        env.append(f"DRAMEMORY_{claim_uid}_NUMANodes={nodes}")
        devices.append({"name": f"claim-{claim_uid}", "containerEdits": {"env": env}})
    spec = {"cdiVersion": CDI_VERSION, "kind": "dra.k8s.io/memory", "devices": devices, "containerEdits": {}}
    return json.dumps(spec, indent=2).encode()


def write_memory_spec(cdi_dir: Path, claims: Sequence[tuple[str, Sequence[MemoryAllocation]]]) -> Path:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = cdi_dir / f"{MEMORY_DRIVER}.json"
    path.write_bytes(memory_spec_bytes(claims))
    return path


def individual_devices(cpus: Iterable[int]) -> tuple[str, ...]:
    """The individual-mode device of each CPU on a machine without SMT and reserved CPUs, where the
    driver's numbering of threads is the CPU ids' order."""
    return tuple(f"cpudev{cpu:03d}" for cpu in sorted(cpus))


def grouped_device(numa_node: int) -> str:
    """The grouped-mode device of a NUMA node (``--cpu-device-group-by=numanode``)."""
    return f"cpudevnuma{numa_node:03d}"


def cpu_claim_devices(
    claim_uid: str, pool: str, devices: Sequence[str], share_id: str | None = None
) -> tuple[DraDevice, ...]:
    """The claim's allocated devices as the kubelet records them, each prepared with the claim's one CDI
    device; a grouped device is shared (consumable capacity): ``share_id``."""
    return tuple(
        DraDevice(CPU_DRIVER, pool, device, (cpu_cdi_device(claim_uid),), share_id) for device in devices
    )


def memory_claim_devices(claim_uid: str, pool: str, devices: Sequence[str]) -> tuple[DraDevice, ...]:
    return tuple(
        DraDevice(MEMORY_DRIVER, pool, device, (memory_cdi_device(claim_uid),)) for device in devices
    )


def dynamic_resource(claim: DraClaim) -> pb.DynamicResource:
    """A claim as podresources' ``List`` shows it for a container that uses it."""
    return pb.DynamicResource(
        claim_name=claim.name,
        claim_namespace=claim.namespace,
        claim_resources=[
            pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name=name) for name in device.cdi_devices],
                driver_name=device.driver,
                pool_name=device.pool,
                device_name=device.device,
                **({"share_id": device.share_id} if device.share_id is not None else {}),
            )
            for device in claim.devices
        ],
    )
