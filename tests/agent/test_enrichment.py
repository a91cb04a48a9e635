"""Opt-in enrichment from the container runtime: a real CRI RuntimeService on a unix socket."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_numa.testing.checkpoints import write_cpu_manager_state
from otel_numa.testing.cri_server import CriServer, one_running_container
from otel_numa.testing.kubelet_scenario import KubeletScenario, ScenarioPod, build_scenario, labels, series
from otel_numa.testing.podresources_server import short_socket_dir
from otel_numa.testing.sysfs_tree import uniform_nodes

UID = "7f6e5d4c-3b2a-4190-8f7e-6d5c4b3a2910"
SECRET = "hunter2-do-not-export"


@pytest.fixture
def node(tmp_path: Path) -> KubeletScenario:
    scenario = build_scenario(tmp_path, uniform_nodes(2, 4), [ScenarioPod(UID, "billing-0", "finance")])
    write_cpu_manager_state(scenario.cpu_manager_path, "static", {0, 1, 2, 3, 6, 7}, {UID: {"api": {4, 5}}})
    return scenario


@pytest.fixture
def runtime() -> Iterator[CriServer]:
    directory = short_socket_dir()
    with CriServer(directory / "containerd.sock") as server:
        one_running_container(
            server,
            (UID, "billing-0", "finance"),
            ("c1", "api"),
            labels={"team": "payments", "app.kubernetes.io/name": "billing", "io.kubernetes.pod.uid": UID},
            annotations={"owner": "alice", "checksum/config": "abc"},
            env={"TEAM": "payments-" + "x" * 300, "DB_PASSWORD": SECRET, "REGION": "eu-1"},
        )
        yield server
    shutil.rmtree(directory, ignore_errors=True)


def enriched(node: KubeletScenario, runtime: CriServer, **overrides: Any) -> str:
    settings: dict[str, Any] = {
        "cri_socket": str(runtime.socket_path),
        "enrich_env": "TEAM,DB_PASSWORD",
        "enrich_pod_labels": "team,app.kubernetes.io/name",
        "enrich_pod_annotations": "owner",
        "enrich_value_max_length": 16,
    }
    settings.update(overrides)
    return node.exposition(**settings)


def test_info_series_exports_allowlisted_env_but_never_a_password(
    node: KubeletScenario, runtime: CriServer
) -> None:
    text = enriched(node, runtime)
    assert series(text, "numa_container_info") == {
        labels(
            k8s_pod_uid=UID,
            k8s_container_name="api",
            k8s_pod_name="billing-0",
            k8s_namespace_name="finance",
            env_TEAM="payments-xxxxxxx",  # cut to 16 characters
            label_team="payments",
            label_app_kubernetes_io_name="billing",
            annotation_owner="alice",
        ): 1
    }
    assert SECRET not in text and "DB_PASSWORD" not in text
    assert "REGION" not in text  # not allowlisted
    # info mode leaves the per-container series alone
    assert series(text, "numa_container_cpu_allocated") == {
        labels(
            k8s_pod_uid=UID,
            k8s_container_name="api",
            k8s_pod_name="billing-0",
            k8s_namespace_name="finance",
            numa_node_id=1,
        ): 2
    }


def test_attributes_mode_puts_them_on_the_per_container_series(
    node: KubeletScenario, runtime: CriServer
) -> None:
    text = enriched(
        node, runtime, enrich_mode="attributes", enrich_pod_annotations="", enrich_pod_labels="team"
    )
    assert series(text, "numa_container_cpu_allocated") == {
        labels(
            k8s_pod_uid=UID,
            k8s_container_name="api",
            k8s_pod_name="billing-0",
            k8s_namespace_name="finance",
            numa_node_id=1,
            env_TEAM="payments-xxxxxxx",
            label_team="payments",
        ): 2
    }
    assert "numa_container_info" not in text
    assert SECRET not in text and "DB_PASSWORD" not in text


def test_nothing_is_exported_unless_enrichment_is_enabled(node: KubeletScenario, runtime: CriServer) -> None:
    text = node.exposition(
        enrich_env="TEAM,DB_PASSWORD", enrich_pod_labels="team"
    )  # cri_socket defaults to none
    assert "numa_container_info" not in text
    assert "env_TEAM" not in text and "label_team" not in text and SECRET not in text
    assert sum(runtime.calls.values()) == 0  # the runtime was not even asked
