"""Pod identities from /var/log/pods directory names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_numa.sources.errors import SourceMissing, SourceUnavailable
from otel_numa.sources.pod_logs import PodIdentity, parse_pod_log_dir_name, read_pod_identities

# Names as the kubelet writes them: a Deployment pod, a StatefulSet pod, a DaemonSet pod, and a
# static pod, whose UID is a hash of its manifest rather than a UUID.
KUBELET_DIRECTORIES = {
    "shop_checkout-7b5d9c6f4-qp8zv_5b2f4c1e-8d3a-4f6b-9e7c-2a1d0b9c8e7f": PodIdentity(
        uid="5b2f4c1e-8d3a-4f6b-9e7c-2a1d0b9c8e7f", name="checkout-7b5d9c6f4-qp8zv", namespace="shop"
    ),
    "databases_postgres-0_0c9b8a7f-6e5d-4c3b-2a19-08f7e6d5c4b3": PodIdentity(
        uid="0c9b8a7f-6e5d-4c3b-2a19-08f7e6d5c4b3", name="postgres-0", namespace="databases"
    ),
    "monitoring_otel-numa-x7k2m_e3a1c2b4-6f5d-4e7a-8b9c-0d1e2f3a4b5c": PodIdentity(
        uid="e3a1c2b4-6f5d-4e7a-8b9c-0d1e2f3a4b5c", name="otel-numa-x7k2m", namespace="monitoring"
    ),
    "kube-system_kube-apiserver-cp-1.example.internal_8e1f6a3c2b9d4e5f7a0b1c2d3e4f5a6b": PodIdentity(
        uid="8e1f6a3c2b9d4e5f7a0b1c2d3e4f5a6b",
        name="kube-apiserver-cp-1.example.internal",
        namespace="kube-system",
    ),
}


def test_reads_every_pod_directory_by_uid(tmp_path: Path) -> None:
    for name in KUBELET_DIRECTORIES:
        (tmp_path / name / "app").mkdir(parents=True)
        (tmp_path / name / "app" / "0.log").write_text("2024-11-19T07:06:40.1Z stdout F started\n")
    assert read_pod_identities(tmp_path) == {
        identity.uid: identity for identity in KUBELET_DIRECTORIES.values()
    }


@pytest.mark.parametrize(
    "name",
    [
        "shop_checkout",  # two parts
        "shop_checkout_5b2f4c1e_extra",  # four parts
        "_checkout_5b2f4c1e-8d3a-4f6b-9e7c-2a1d0b9c8e7f",  # empty namespace
        "shop__5b2f4c1e-8d3a-4f6b-9e7c-2a1d0b9c8e7f",  # empty name
        "shop_checkout_",  # empty uid
        "Shop_Checkout_5b2f4c1e-8d3a-4f6b-9e7c-2a1d0b9c8e7f",  # upper case is not a Kubernetes name
        "lost+found",
        ".hidden",
    ],
)
def test_names_of_another_form_are_skipped(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    assert parse_pod_log_dir_name(name) is None
    assert read_pod_identities(tmp_path) == {}


def test_files_are_not_pods(tmp_path: Path) -> None:
    (tmp_path / "default_web-0_1d2e3f4a-5b6c-4d7e-8f90-a1b2c3d4e5f6").write_text("")
    assert read_pod_identities(tmp_path) == {}


def test_symlinked_pod_directory_counts(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    root = tmp_path / "pods"
    root.mkdir()
    (root / "default_web-0_1d2e3f4a-5b6c-4d7e-8f90-a1b2c3d4e5f6").symlink_to(real)
    assert read_pod_identities(root) == {
        "1d2e3f4a-5b6c-4d7e-8f90-a1b2c3d4e5f6": PodIdentity(
            uid="1d2e3f4a-5b6c-4d7e-8f90-a1b2c3d4e5f6", name="web-0", namespace="default"
        )
    }


def test_empty_root_has_no_pods(tmp_path: Path) -> None:
    assert read_pod_identities(tmp_path) == {}


def test_absent_root_is_missing(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        read_pod_identities(tmp_path / "var" / "log" / "pods")


def test_root_that_is_a_file_is_missing(tmp_path: Path) -> None:
    (tmp_path / "pods").write_text("")
    with pytest.raises(SourceMissing):
        read_pod_identities(tmp_path / "pods")


def test_unlistable_root_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Running as root here, so the permission error a non-root agent would meet is simulated.
    def refuse(path: object) -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", refuse)
    with pytest.raises(SourceUnavailable) as raised:
        read_pod_identities(tmp_path)
    assert "Permission denied" in str(raised.value)
