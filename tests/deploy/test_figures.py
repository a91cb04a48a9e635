"""One set of figures: the agent's measured memory and series, as the README, docs/kubernetes.md and the
chart's values.yaml state them for sizing, agree with each other and with the current table of
docs/performance.md (where the benchmarks write them)."""

from __future__ import annotations

import re

from tests.support import REPO

SIZING = re.compile(
    r"about (?P<small_mb>\d+) MB RSS on a 2-NUMA node with 110 pods \((?P<small_series>[\d,]+) series\) and "
    r"about (?P<large_mb>\d+) MB on an 8-NUMA node with 1,000 containers \((?P<large_series>[\d,]+) series\)"
)
DOCUMENTS = ("README.md", "docs/kubernetes.md", "config/helm/otel-numa/values.yaml")


def prose(text: str) -> str:
    """The text with YAML comment markers and line breaks taken out."""
    return " ".join(re.sub(r"^\s*#\s?", "", line) for line in text.splitlines()).replace("  ", " ")


def figures(name: str) -> dict[str, str]:
    found = [match.groupdict() for match in SIZING.finditer(prose((REPO / name).read_text()))]
    assert len(found) == 1, f"{name} states the sizing figures {len(found)} times"
    return found[0]


def test_every_document_states_the_same_figures() -> None:
    stated = {name: figures(name) for name in DOCUMENTS}
    assert len({tuple(value.items()) for value in stated.values()}) == 1, stated


def test_the_figures_are_the_current_measurements() -> None:
    performance = (REPO / "docs" / "performance.md").read_text()
    small_rss = re.search(
        r"^\| 2x32: RSS with both readers ≤ 60 MB \| ([\d.]+) MB", performance, re.MULTILINE
    )
    large_rss = re.search(r"^\| 8x48: RSS < 100 MB \| ([\d.]+) MB", performance, re.MULTILINE)
    small_series = re.search(r"^\| series exposed \| (\d+) \|", performance, re.MULTILINE)
    assert small_rss and large_rss and small_series, "docs/performance.md's current table changed its rows"
    stated = figures("README.md")
    assert int(stated["small_mb"]) == round(float(small_rss.group(1)))
    assert int(stated["large_mb"]) == round(float(large_rss.group(1)))
    assert int(stated["small_series"].replace(",", "")) == int(small_series.group(1))


def test_the_check_sees_a_stale_figure() -> None:
    stale = SIZING.search(
        "about 54 MB RSS on a 2-NUMA node with 110 pods (1,681 series) and about 70 MB on an 8-NUMA node "
        "with 1,000 containers (13,835 series)"
    )
    assert stale is not None and stale.groupdict() != figures("README.md")
