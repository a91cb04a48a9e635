"""The agent's whole page for a few fixed machines equals the page kept in tests/fixtures/golden/, so that
every change to a metric's name, labels or value on them shows in review."""

from __future__ import annotations

import difflib

import pytest

from otel_numa.testing.golden import MACHINES, GoldenMachine, golden_path, masked, page_of


@pytest.mark.parametrize("machine", MACHINES, ids=lambda machine: machine.name)
def test_the_page_is_the_golden_one(machine: GoldenMachine) -> None:
    kept = golden_path(machine).read_text()
    page = page_of(machine)
    if page != kept:
        diff = "".join(
            difflib.unified_diff(kept.splitlines(True), page.splitlines(True), "golden", "now", n=1)
        )
        pytest.fail(
            f"the page of {machine.name} changed; if that is intended, run "
            f"`.venv/bin/python -m otel_numa.testing.golden --update` and review the diff:\n{diff}"
        )


def test_only_what_varies_is_masked_and_each_family_is_sorted() -> None:
    page = (
        'target_info{host_name="box",service_version="1.2"} 1.0\n'
        "# TYPE numa_agent_source_age_seconds gauge\n"
        'numa_agent_source_age_seconds{numa_source="sysfs"} 0.25\n'
        "# TYPE numa_agent_source_errors_total counter\n"
        'numa_agent_source_errors_total{numa_source="sysfs"} 3.0\n'
        'numa_agent_source_errors_total{numa_source="procfs"} 1.0\n'
        "process_thread_count 4.0\n"
    )
    assert masked(page) == (
        'target_info{host_name="<varies>",service_version="<varies>"} 1.0\n'
        "# TYPE numa_agent_source_age_seconds gauge\n"
        'numa_agent_source_age_seconds{numa_source="sysfs"} <varies>\n'
        "# TYPE numa_agent_source_errors_total counter\n"
        'numa_agent_source_errors_total{numa_source="procfs"} 1.0\n'
        'numa_agent_source_errors_total{numa_source="sysfs"} 3.0\n'
        "process_thread_count <varies>\n"
    )
