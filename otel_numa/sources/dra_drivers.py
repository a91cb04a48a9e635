"""What the DRA drivers that hand out CPUs and memory write into a claim's CDI device.

Written from the drivers' published sources (docs/decisions/records.md names the releases):

- CPUs, kubernetes-sigs/dra-driver-cpu (driver ``dra.cpu``): one transient spec per claim,
  ``/var/run/cdi/dra.k8s.io-cpu_claim-<claim UID>.json``, kind ``dra.k8s.io/cpu``, one device
  ``claim-<claim UID>`` whose container edits set ``DRA_CPUSET_<claim UID>=<cpuset>`` in the kernel's list
  format (``4-5,68-69``). Either device mode (a device per CPU, or grouped devices with a CPU count) writes
  the same. A value that is not a cpuset (``dynamic``: the CPUs may move, only the cgroup knows them) names
  no CPUs.
- Memory, the DRA memory driver (driver ``dra.memory``): one spec ``/var/run/cdi/dra.memory.json``, kind
  ``dra.k8s.io/memory``, a device ``claim-<claim UID>`` per claim whose edits set
  ``DRAMEMORY_<claim UID>_<resource>=numanode:<id>,size:<quantity>`` for each resource (``memory``,
  ``hugepages_2Mi``: the resource name with ``_`` for ``-``) and ``DRAMEMORY_<claim UID>_NUMANodes=<ids>``.

A value that names CPUs or NUMA nodes the machine lacks, or is not in these formats, is never trusted: the
caller gets a :class:`SourceCorrupt` and uses none of the claim's values.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from otel_numa.model import ContainerMemory
from otel_numa.sources.errors import SourceCorrupt
from otel_numa.sources.files import MAX_CPU_ID, MAX_NUMA_NODE_ID, OUT_OF_RANGE, parse_cpulist

CPU_DRIVER = "dra.cpu"
MEMORY_DRIVER = "dra.memory"
CPU_AND_MEMORY_DRIVERS = frozenset({CPU_DRIVER, MEMORY_DRIVER})
CPUSET_PREFIX = "DRA_CPUSET_"
MEMORY_PREFIX = "DRAMEMORY_"
DYNAMIC = "dynamic"  # a CPU claim whose CPUs the driver may move: the cgroup has the live set
INVALID_VALUE = "invalid_spec"  # counted as a spec that cannot be used, under the cdi source

# the kernel's list format, exactly: no blanks, no empty parts
_ID_LIST = re.compile(r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*")
_MEMORY_VALUE = re.compile(r"numanode:([0-9]+),size:([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_MULTIPLIERS = {
    None: 1,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_HUGEPAGES_ENV = "hugepages_"
_NUMA_NODES_KEY = "NUMANodes"


def _ids(text: str, known: Collection[int] | None, limit: int, what: str) -> frozenset[int]:
    if not _ID_LIST.fullmatch(text):
        raise SourceCorrupt(f"{what} is not a list of ids", error_type=INVALID_VALUE)  # never quoted
    try:
        ids = parse_cpulist(text, limit)
    except SourceCorrupt as error:  # a range backwards, or past any machine
        kind = OUT_OF_RANGE if error.error_type == OUT_OF_RANGE else INVALID_VALUE
        raise SourceCorrupt(f"{what} is not a list of ids", error_type=kind) from None
    if known is not None and not ids.issubset(known):
        raise SourceCorrupt(f"{what} names ids the machine does not have", error_type=OUT_OF_RANGE)
    return ids


def claim_cpus(env: Iterable[str], machine_cpus: Collection[int] | None = None) -> frozenset[int] | None:
    """The CPUs the ``DRA_CPUSET_*`` entries of one CDI device name; None when there is none or one is
    ``dynamic``. A value that is not a cpuset of ``machine_cpus`` raises :class:`SourceCorrupt`."""
    found: set[int] = set()
    given = False
    for entry in env:
        key, separator, value = entry.partition("=")
        if not separator or not key.startswith(CPUSET_PREFIX):
            continue
        if value == DYNAMIC:
            return None
        found |= _ids(value, machine_cpus, MAX_CPU_ID, f"{key}")
        given = True
    return frozenset(found) if given else None


def claim_memory(
    env: Iterable[str], machine_nodes: Collection[int] | None = None
) -> tuple[ContainerMemory, ...]:
    """The memory and hugepages blocks the ``DRAMEMORY_*`` entries of one CDI device name, each on its NUMA
    node, in the order given; a value in no known format, or on a node the machine lacks, raises
    :class:`SourceCorrupt`. ``DRAMEMORY_<uid>_NUMANodes`` must name the blocks' nodes, no more."""
    blocks: list[ContainerMemory] = []
    listed: frozenset[int] | None = None
    for entry in env:
        key, separator, value = entry.partition("=")
        if not separator or not key.startswith(MEMORY_PREFIX):
            continue
        # DRAMEMORY_<claim uid>_<resource>: a UID holds no "_"
        _claim, underscore, resource = key[len(MEMORY_PREFIX) :].partition("_")
        if not underscore or not resource:
            raise SourceCorrupt(f"{key}: not DRAMEMORY_<claim>_<resource>", error_type=INVALID_VALUE)
        if resource == _NUMA_NODES_KEY:
            listed = _ids(value, machine_nodes, MAX_NUMA_NODE_ID, key)
            continue
        if resource == "memory":
            memory_type = "memory"
        elif resource.startswith(_HUGEPAGES_ENV) and len(resource) > len(_HUGEPAGES_ENV):
            memory_type = "hugepages-" + resource[len(_HUGEPAGES_ENV) :]
        else:
            continue  # a resource of a later release: not counted
        match = _MEMORY_VALUE.fullmatch(value)
        if match is None:
            raise SourceCorrupt(f"{key}: not numanode:<id>,size:<quantity>", error_type=INVALID_VALUE)
        numa = int(match.group(1))
        if numa > MAX_NUMA_NODE_ID or (machine_nodes is not None and numa not in machine_nodes):
            raise SourceCorrupt(f"{key}: a NUMA node the machine does not have", error_type=OUT_OF_RANGE)
        size = int(match.group(2)) * _MULTIPLIERS[match.group(3)]
        blocks.append(ContainerMemory(memory_type, size, (numa,)))
    if listed is not None and listed != {numa for block in blocks for numa in block.numa_ids}:
        raise SourceCorrupt("NUMANodes differs from the blocks' nodes", error_type=INVALID_VALUE)
    return tuple(blocks)
