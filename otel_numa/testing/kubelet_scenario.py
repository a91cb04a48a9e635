"""A node for allocation tests: a synthetic sysfs/procfs tree, a kubelet directory and pod log directories.

Typical use::

    scenario = build_scenario(tmp_path, uniform_nodes(2, 4), [ScenarioPod(UID, "web", "shop")])
    write_cpu_manager_state(scenario.cpu_manager_path, "static", {0, 1}, {UID: {"app": {2, 3}}})
    text = scenario.exposition()                      # in-process agent, one collection
    series(text, "numa_cpu_allocated")                # {frozenset(labels): value}

The checkpoints themselves are written with :mod:`otel_numa.testing.checkpoints`. The exposition text is
read back with prometheus_client's own parser, so tests see what a Prometheus server would scrape.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.testing.peers import agent_command
from otel_numa.testing.sysfs_tree import NodeSpec, write_machine

NODE_NAME = "scenario-node"

Labels = frozenset[tuple[str, str]]
Samples = dict[str, dict[Labels, float]]  # sample name -> {label set: value}


@dataclass(frozen=True)
class ScenarioPod:
    """A pod as the kubelet's directories show it.

    ``name`` (with ``namespace``) gives the pod a ``<pod-logs-root>/<namespace>_<name>_<uid>`` directory;
    ``live=False`` leaves out ``<kubelet-root>/pods/<uid>``, so its checkpoint entries are stale.
    """

    uid: str
    name: str | None = None
    namespace: str = "default"
    live: bool = True


@dataclass(frozen=True)
class KubeletScenario:
    sysfs_root: Path
    procfs_root: Path
    kubelet_root: Path
    pod_logs_root: Path

    @property
    def cpu_manager_path(self) -> Path:
        return self.kubelet_root / "cpu_manager_state"

    @property
    def memory_manager_path(self) -> Path:
        return self.kubelet_root / "memory_manager_state"

    @property
    def device_checkpoint_path(self) -> Path:
        return self.kubelet_root / "device-plugins" / "kubelet_internal_checkpoint"

    def cli_args(self, *extra: str, podresources: bool = False) -> list[str]:
        """The agent's flags for this node; unless ``podresources``, ``--podresources-socket none`` (the
        checkpoints alone decide), else the default socket under the kubelet root."""
        args = [
            "--sysfs-root",
            str(self.sysfs_root),
            "--procfs-root",
            str(self.procfs_root),
            "--kubelet-root",
            str(self.kubelet_root),
            "--pod-logs-root",
            str(self.pod_logs_root),
            "--node-name",
            NODE_NAME,
        ]
        if not podresources:
            args += ["--podresources-socket", "none"]
        return [*args, *extra]

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "sysfs_root": self.sysfs_root,
            "procfs_root": self.procfs_root,
            "kubelet_root": self.kubelet_root,
            "pod_logs_root": self.pod_logs_root,
            "podresources_socket": "none",
            "node_name": NODE_NAME,
            "prometheus_address": "none",
            "health_address": "none",
        }
        values.update(overrides)
        return Settings(**values)

    def agent(self, **overrides: Any) -> Agent:
        """An in-process agent (not started) over this node."""
        return Agent(self.settings(**overrides).to_options())

    def exposition(self, **overrides: Any) -> str:
        """One collection by a fresh in-process agent, as Prometheus text."""
        with self.agent(**overrides) as agent:
            return agent.exposition_once().decode()

    def run_once(self, *extra: str, timeout_s: float = 30) -> str:
        """``python -m otel_numa --once`` over this node, in a subprocess; its standard output."""
        completed = subprocess.run(
            agent_command(*self.cli_args("--once", *extra)),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        assert completed.returncode == 0, completed.stderr.decode(errors="replace")
        return completed.stdout.decode()

    def add_pod(self, pod: ScenarioPod) -> None:
        _write_pod(self, pod)

    def remove_pod_directory(self, uid: str) -> None:
        """The pod was deleted: its directory under ``<kubelet-root>/pods/`` goes (entries stay stale)."""
        (self.kubelet_root / "pods" / uid / "containers").rmdir()
        (self.kubelet_root / "pods" / uid).rmdir()


def _write_pod(scenario: KubeletScenario, pod: ScenarioPod) -> None:
    if pod.live:
        (scenario.kubelet_root / "pods" / pod.uid / "containers").mkdir(parents=True)
    if pod.name is not None:
        (scenario.pod_logs_root / f"{pod.namespace}_{pod.name}_{pod.uid}").mkdir(parents=True)


def build_scenario(
    root: Path, nodes: Sequence[NodeSpec], pods: Iterable[ScenarioPod] = (), **machine: Any
) -> KubeletScenario:
    """Write ``root/sys``, ``root/proc`` (see :func:`write_machine`, ``machine`` is passed on), an empty
    ``root/kubelet`` (with ``pods/`` and ``device-plugins/``) and ``root/pod-logs``; then each pod's dirs."""
    sysfs_root, procfs_root = write_machine(root, nodes, **machine)
    kubelet_root = root / "kubelet"
    (kubelet_root / "pods").mkdir(parents=True)
    (kubelet_root / "device-plugins").mkdir()
    pod_logs_root = root / "pod-logs"
    pod_logs_root.mkdir()
    scenario = KubeletScenario(sysfs_root, procfs_root, kubelet_root, pod_logs_root)
    for pod in pods:
        _write_pod(scenario, pod)
    return scenario


# Reading the exposition -------------------------------------------------------------------------


def parse_exposition(text: str) -> Samples:
    """Prometheus text -> sample name -> {label set: value}, parsed by prometheus_client.

    Labels with an empty value are dropped: for Prometheus an empty label is no label, and the exporter
    writes one wherever another series of the family has that label.
    """
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            present = frozenset((key, value) for key, value in sample.labels.items() if value != "")
            samples.setdefault(sample.name, {})[present] = sample.value
    return samples


def series(text: str | Samples, name: str, *, keep_node_name: bool = False) -> dict[Labels, float]:
    """The samples of one series name, from the text or its :func:`parse_exposition`; ``k8s_node_name``
    (the same on every series) is dropped unless kept."""
    samples = parse_exposition(text) if isinstance(text, str) else text
    found = samples.get(name, {})
    if keep_node_name:
        return found
    return {frozenset(kv for kv in key if kv[0] != "k8s_node_name"): value for key, value in found.items()}


def labels(**pairs: str | int) -> Labels:
    """A label set for comparisons: ``labels(numa_node_id=0)``."""
    return frozenset((key, str(value)) for key, value in pairs.items())


def counted_errors(text: str | Samples) -> dict[Labels, float]:
    """``numa_agent_source_errors_total`` without the counters still at 0 (every read source has some)."""
    return {key: value for key, value in series(text, "numa_agent_source_errors_total").items() if value}
