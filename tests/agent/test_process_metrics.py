"""The agent's own cost (process.* series of the health group) as users see it: on the page of the real
serving process, agreeing with what the kernel says about that process in /proc/<pid>/stat and status."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.export.pipeline import build_pipeline
from otel_numa.instruments.catalogue import MetricGroup
from otel_numa.options import AgentOptions
from otel_numa.sources.process import OwnProcess
from otel_numa.testing.peers import run_agent

PROCESS_SERIES = (
    "process_cpu_time_seconds_total",
    "process_memory_usage_bytes",
    "process_open_file_descriptor_count",
    "process_thread_count",
)


class KernelView:
    """One reading of /proc/<pid> done the plain way, independently of psutil."""

    def __init__(self, pid: int) -> None:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
        ticks = os.sysconf("SC_CLK_TCK")
        self.user_s = int(fields[11]) / ticks  # field 14, utime
        self.system_s = int(fields[12]) / ticks  # field 15, stime
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        self.rss_bytes = int(status["VmRSS"].split()[0]) * 1024
        self.threads = int(status["Threads"])
        self.fds = len(os.listdir(f"/proc/{pid}/fd"))


def page_values(text: str) -> dict[tuple[str, str], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("process_"):
                found[(sample.name, sample.labels.get("cpu_mode", ""))] = sample.value
    return found


def test_process_series_agree_with_proc_of_the_serving_process(tmp_path: Path) -> None:
    with run_agent(["--interval", "60", "--node-name", "cost"], tmp_path) as agent:
        pid = agent.process.pid  # the serving process: the command exec's itself, same PID
        agent.metrics_text()  # first scrape: the page's own buffers are in place
        before = KernelView(pid)
        values = page_values(agent.metrics_text())
        after = KernelView(pid)
    assert before.user_s <= values[("process_cpu_time_seconds_total", "user")] <= after.user_s
    assert before.system_s <= values[("process_cpu_time_seconds_total", "system")] <= after.system_s
    low, high = sorted((before.rss_bytes, after.rss_bytes))
    # read at the start of the scrape; the page's rendering may move RSS by a little
    assert 0.9 * low <= values[("process_memory_usage_bytes", "")] <= 1.1 * high
    low, high = sorted((before.threads, after.threads))
    assert low <= values[("process_thread_count", "")] <= high
    low, high = sorted((before.fds, after.fds))
    # the scrape's own connection is open while the page is rendered
    assert low <= values[("process_open_file_descriptor_count", "")] <= high + 1


def _exposition(monkeypatch: pytest.MonkeyPatch, *args: MetricGroup) -> tuple[str, int]:
    reads = 0
    real_read = OwnProcess.read

    def counting_read(self: OwnProcess) -> object:
        nonlocal reads
        reads += 1
        return real_read(self)

    monkeypatch.setattr(OwnProcess, "read", counting_read)
    settings = Settings(node_name="once", kubelet_root=Path("/nonexistent"), disable=frozenset(args))
    return generate_latest_once(settings.to_options()), reads


def generate_latest_once(options: AgentOptions) -> str:
    """One Prometheus collection of a pipeline over ``options``, as a scrape makes it."""
    agent = Agent(options)
    pipeline = build_pipeline(options, agent.store, exporters=("prometheus",))
    try:
        assert pipeline.registry is not None
        return generate_latest(pipeline.registry).decode()
    finally:
        pipeline.shutdown(timeout_s=1)


def test_process_is_read_once_per_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    text, reads = _exposition(monkeypatch)
    assert reads == 1  # four instruments, five series, one read
    names = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    assert set(PROCESS_SERIES) <= names


def test_health_group_off_reads_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    text, reads = _exposition(monkeypatch, MetricGroup.HEALTH)
    assert reads == 0
    assert not any(name in text for name in PROCESS_SERIES)


def kernel_counts_descriptors_by_size() -> bool:
    return os.stat("/proc/self/fd").st_size > 0  # Linux 6.2 and later


@pytest.mark.parametrize("by_size", [True, False], ids=["fd-directory-size", "fd-listing"])
def test_open_descriptors_follow_those_opened_and_closed(
    by_size: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted by the size of /proc/self/fd where the kernel gives it, else by listing it: either way the
    count is the kernel's listing (less the listing's own descriptor) and moves with every descriptor."""
    from otel_numa.sources import process as own

    if by_size and not kernel_counts_descriptors_by_size():
        pytest.skip("this kernel gives no size for /proc/self/fd (before Linux 6.2)")
    if not by_size:
        monkeypatch.setattr(own, "descriptors_by_size", lambda: 0)  # as a kernel before 6.2 answers
    reader = OwnProcess()
    assert reader._count_by_size is by_size
    before = reader.read().open_file_descriptors
    assert before == len(os.listdir("/proc/self/fd")) - 1
    opened = [os.open(tmp_path, os.O_RDONLY) for _ in range(200)]
    try:
        assert reader.read().open_file_descriptors == before + 200
    finally:
        for fd in opened:
            os.close(fd)
    assert reader.read().open_file_descriptors == before


def test_a_size_that_disagrees_with_the_listing_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_numa.sources import process as own

    monkeypatch.setattr(own, "descriptors_by_size", lambda: 4096)  # a directory size that is no count
    reader = OwnProcess()
    assert not reader._count_by_size
    assert reader.read().open_file_descriptors == len(os.listdir("/proc/self/fd")) - 1
