"""Try the newest OpenTelemetry and prometheus-client releases before they become the proven ones.

    .venv/bin/python scripts/upgrade_check.py            # try, report which patches still hold
    .venv/bin/python scripts/upgrade_check.py --accept   # and, when every check holds, move the proven set

In a throwaway virtual environment it installs this checkout with the newest releases that pyproject.toml
admits (everything else as constraints.txt pins it), then, on those releases:

1. runs each accelerator patch's own check (``Patch.check``);
2. runs the two-path identity tests (tests/agent/test_two_paths.py) with the version check lifted, so the
   accelerated path is compared with the public one on the new releases;
3. runs tests/e2e/test_upgrade.py (the public path scraped by Prometheus and pushed to rotel);
4. measures the patch ledger on the 2x32 node (benchmarks/bench_patches.py, written beside, not over,
   docs/patches.md);

and prints which patches hold. ``--accept`` (only when all of it passed) writes the new releases into
constraints.txt and PROVEN_RELEASES; then measure the ledger in full (docs/upgrading.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"
PROVEN_FILE = REPO / "otel_numa" / "export" / "fast" / "__init__.py"
# the packages whose releases the accelerated path depends on, and the OpenTelemetry packages released with
# them (left unpinned in the trial, so pip takes the newest matching set)
TRIED = re.compile(r"^(opentelemetry-[a-z-]+|prometheus[-_]client)==", re.IGNORECASE)
UNPROVEN_ENV = "OTEL_NUMA_FAST_PATH_UNPROVEN"


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(command), flush=True)
    kwargs.setdefault("cwd", REPO)
    return subprocess.run(command, text=True, check=False, **kwargs)


def trial_environment(work: Path) -> Path:
    """A venv with this checkout, its test tools, and the newest admitted OpenTelemetry releases."""
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)]).check_returncode()
    python = venv / "bin" / "python"
    others = work / "others.txt"  # every pin but the tried packages'
    others.write_text(
        "".join(line + "\n" for line in CONSTRAINTS.read_text().splitlines() if not TRIED.match(line))
    )
    install = [
        str(python),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "-c",
        str(others),
    ]
    run([*install, "--upgrade", "--upgrade-strategy", "eager", f"{REPO}[test]"]).check_returncode()
    return python


def installed(python: Path) -> dict[str, str]:
    script = (
        "import json, importlib.metadata as m\n"
        "from otel_numa.export.fast import PROVEN_RELEASES\n"
        "print(json.dumps({p: m.version(p) for p in PROVEN_RELEASES}))"
    )
    done = run([str(python), "-c", script], capture_output=True, cwd="/")
    done.check_returncode()
    found: dict[str, str] = json.loads(done.stdout)
    return found


def patch_checks(python: Path) -> dict[str, str | None]:
    script = (
        "import json\n"
        # both OTLP exporters loaded: reused_requests checks the exporters a process has loaded
        "import opentelemetry.exporter.otlp.proto.grpc.metric_exporter\n"
        "import opentelemetry.exporter.otlp.proto.http.metric_exporter\n"
        "from otel_numa.export.fast import PATCHES\n"
        "def why(patch):\n"
        "    try:\n"
        "        return patch.check()\n"
        "    except Exception as error:\n"
        "        return f'{type(error).__name__}: {error}'\n"
        "print(json.dumps({patch.name: why(patch) for patch in PATCHES}))"
    )
    done = run([str(python), "-c", script], capture_output=True, cwd="/")
    done.check_returncode()
    found: dict[str, str | None] = json.loads(done.stdout.splitlines()[-1])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--accept", action="store_true", help="move the proven set when every check holds")
    parser.add_argument("--skip-ledger", action="store_true", help="leave out the ledger measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otel-numa-upgrade-") as folder:
        work = Path(folder)
        python = trial_environment(work)
        versions = installed(python)
        from otel_numa.export.fast import PROVEN_RELEASES

        print("\nreleases (proven -> newest admitted):")
        for package, proven in PROVEN_RELEASES.items():
            mark = "" if versions[package] == proven else "  (new)"
            print(f"  {package}: {proven} -> {versions[package]}{mark}")
        checks = patch_checks(python)
        lifted = {**os.environ, UNPROVEN_ENV: "1"}
        identity = run(
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/agent/test_two_paths.py"],
            env=lifted,
        )
        public = run(
            [
                str(python),
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "upgrade",
                "tests/e2e/test_upgrade.py",
            ]
        )
        ledger_ok = True
        if not args.skip_ledger:
            ledger = work / "patches.md"
            measured = run(
                [
                    str(python),
                    "-m",
                    "benchmarks.bench_patches",
                    "--trees",
                    "2x32",
                    "--ledger-to",
                    str(ledger),
                ],
                env=lifted,
            )
            ledger_ok = measured.returncode == 0
            if ledger_ok:
                print(ledger.read_text())
        print("\npatches on the newest releases:")
        for name, why in checks.items():
            print(f"  {name}: {'holds' if why is None else 'fails: ' + why}")
        print(f"  two-path identity tests: {'pass' if identity.returncode == 0 else 'FAIL'}")
        print(f"  public path against Prometheus and rotel: {'pass' if public.returncode == 0 else 'FAIL'}")
        holds = all(why is None for why in checks.values()) and identity.returncode == 0
        holds = holds and public.returncode == 0 and ledger_ok
        if not args.accept:
            return 0 if holds else 1
        if not holds:
            print("not accepted: the proven set stays as it is", file=sys.stderr)
            return 1
        frozen = run([str(python), "-m", "pip", "freeze", "--exclude-editable"], capture_output=True)
        frozen.check_returncode()
        accept(versions, frozen.stdout)
        print("accepted: constraints.txt and PROVEN_RELEASES moved; now measure the ledger in full")
        return 0


def accept(versions: dict[str, str], frozen: str) -> None:
    """Write the trial's releases of the tried packages into constraints.txt and PROVEN_RELEASES."""
    newest = {
        line.split("==")[0].lower().replace("_", "-"): line
        for line in frozen.splitlines()
        if TRIED.match(line)
    }
    lines = []
    for line in CONSTRAINTS.read_text().splitlines():
        name = line.split("==")[0].lower().replace("_", "-")
        lines.append(newest.pop(name, line) if TRIED.match(line) else line)
    runtime_end = next(i for i, line in enumerate(lines) if line.startswith("# test"))
    lines[runtime_end:runtime_end] = [*sorted(newest.values()), ""] if newest else []
    CONSTRAINTS.write_text("\n".join(lines) + "\n")
    text = PROVEN_FILE.read_text()
    for package, release in versions.items():
        text = re.sub(rf'("{re.escape(package)}": )"[^"]*"', rf'\g<1>"{release}"', text)
    PROVEN_FILE.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
