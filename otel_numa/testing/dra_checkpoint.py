"""The kubelet's DRA manager checkpoint, for tests: the agent's reader, and a writer of valid files."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable

from otel_numa.model import DraClaim, DraManagerState
from otel_numa.sources.checkpoints.dra_manager import parse_dra_checkpoint, read_dra_checkpoint

__all__ = ["DraManagerState", "dra_checkpoint_bytes", "parse_dra_checkpoint", "read_dra_checkpoint"]


def dra_checkpoint_bytes(claims: Iterable[DraClaim]) -> bytes:
    """A ``dra_manager_state`` file as the kubelet writes it (v1 ``Entries``, CRC-32 of the Data text)."""
    entries = []
    for claim in claims:
        drivers: dict[str, list[dict[str, object]]] = {}
        for device in claim.devices:
            entry: dict[str, object] = {
                "PoolName": device.pool,
                "DeviceName": device.device,
                "RequestNames": ["req"],
                "CDIDeviceIDs": list(device.cdi_devices),
            }
            if device.share_id is not None:
                entry["ShareID"] = device.share_id
            drivers.setdefault(device.driver, []).append(entry)
        entries.append(
            {
                "ClaimUID": claim.uid,
                "ClaimName": claim.name,
                "Namespace": claim.namespace,
                "PodUIDs": {uid: {} for uid in sorted(claim.pod_uids)},
                "DriverState": {driver: {"Devices": devices} for driver, devices in drivers.items()},
            }
        )
    data = json.dumps(
        {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1", "Entries": entries},
        separators=(",", ":"),
    )
    return json.dumps({"Data": data, "Checksum": zlib.crc32(data.encode())}).encode()
