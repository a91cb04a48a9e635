#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with the agent (and, with --test, the test tools and the
# Debian packages the tests run for real: prometheus, prometheus-node-exporter, hwloc).
# Quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

apt_install() {
    local missing=()
    for spec in "$@"; do
        local bin="${spec%%:*}" pkg="${spec##*:}"
        command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: please install these Debian packages: ${missing[*]}" >&2
        exit 1
    fi
    echo "setup: apt-get install ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "setup: Python 3.11 or newer is needed as '$PYTHON'" >&2
    exit 1
fi
# Debian splits venv/ensurepip into python3-venv.
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    apt_install "__no_such_binary__:python3-venv"
fi
if [ $want_test -eq 1 ]; then
    apt_install prometheus:prometheus prometheus-node-exporter:prometheus-node-exporter \
        lstopo-no-graphics:hwloc-nox
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
extras=""
[ $want_test -eq 1 ] && extras="[test]"
stamp=".venv/.installed$extras"
digest="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".$extras"
    echo "$digest" > "$stamp"
fi
