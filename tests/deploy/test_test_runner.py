"""How scripts/test.sh runs the suite: the container-engine modules share one worker, so that no worker
waits for another's turn at the engine, and each module with a costly module-scoped fixture runs on one
worker, which sets it up once (tests/conftest.py), whatever pytest and xdist releases are pinned."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ONE_ENGINE, ONE_WORKER

REPO = Path(__file__).resolve().parents[2]

ENGINE_MODULE = """
def test_{number}(worker_id):
    with open("workers.txt", "a") as out:
        out.write("{module} " + worker_id + "\\n")
"""


def test_the_container_engine_modules_and_costly_fixtures_run_on_one_worker(tmp_path: Path) -> None:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the root, not the repository
    for module in ONE_ENGINE | ONE_WORKER:
        tests = (ENGINE_MODULE.format(number=number, module=module) for number in range(6))
        (tmp_path / module).write_text("".join(tests))
    (tmp_path / "test_other.py").write_text(
        "".join(f"def test_{n}():\n    pass\n" for n in range(12))  # work for the other workers
    )
    run = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "pytest",
                "-n",
                "2",
                "--dist",
                "loadgroup",
                "-q",
                "-p",
                "no:cacheprovider",
            ),
            # a temporary directory of its own: pytest's default one would remove the suite's older ones
            *("--basetemp", str(tmp_path / "basetemp")),
        ],
        cwd=tmp_path,
        env={**os.environ, "OTEL_NUMA_TEST_ENGINE_LOCK": str(tmp_path / "engine.lock")},  # not the suite's
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = (tmp_path / "workers.txt").read_text().split()
    workers_of: dict[str, set[str]] = {}
    for module, worker in zip(lines[0::2], lines[1::2], strict=True):
        workers_of.setdefault(module, set()).add(worker)
    assert set(workers_of) == ONE_ENGINE | ONE_WORKER and len(lines) == 2 * 6 * len(workers_of)
    engine_workers = set().union(*(workers_of[module] for module in ONE_ENGINE))
    assert len(engine_workers) == 1, f"the container-engine tests ran on {sorted(engine_workers)}"
    spread = {module: sorted(workers) for module, workers in workers_of.items() if len(workers) > 1}
    assert not spread, f"modules whose tests ran on more than one worker: {spread}"
