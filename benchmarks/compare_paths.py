"""The cost targets of two ``bench_cost`` runs side by side: the accelerated and the public export path.

.venv/bin/python -m benchmarks.compare_paths benchmarks/out/cost-fast.json benchmarks/out/cost-public.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def side_by_side(fast: dict[str, Any], public: dict[str, Any]) -> str:
    public_rows = {row[0]: row for row in public["summary"]}
    lines = [
        f"accelerated path: {fast['label']}; public path: {public['label']}",
        "",
        "| target | accelerated (`--fast-path auto`) | public (`--fast-path off`) | public / accelerated |",
        "|---|---:|---:|---:|",
    ]
    for label, value, form, met in fast["summary"]:
        other = public_rows.get(label)
        other_value = other[1] if other is not None else None
        shown = [form.format(v) if v is not None else "not measured" for v in (value, other_value)]
        marks = ["" if m is None else (" (met)" if m else " (missed)") for m in (met, other and other[3])]
        ratio = f"{other_value / value:.2f}x" if value and other_value is not None else "n/a"
        lines.append(f"| {label} | {shown[0]}{marks[0]} | {shown[1]}{marks[1]} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    fast, public = (json.loads(Path(name).read_text()) for name in argv)
    print(side_by_side(fast, public))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
