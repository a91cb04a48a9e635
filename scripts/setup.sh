#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with the agent (and, with --test, the test tools and the
# Debian packages the tests run for real: prometheus, prometheus-node-exporter, hwloc).
# Quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1
PYTHON="${PYTHON:-python3}"

# Debian packages still missing, given as "check-command:package" pairs.
missing_packages() {
    for spec in "$@"; do
        local check="${spec%%:*}" package="${spec##*:}"
        eval "$check" >/dev/null 2>&1 || echo "$package"
    done
}

apt_install() {
    [ $# -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: please install these Debian packages: $*" >&2
        exit 1
    fi
    echo "setup: apt-get install $*" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "setup: Python 3.11 or newer is needed as '$PYTHON'" >&2
    exit 1
fi

wanted=("$PYTHON -c 'import ensurepip, venv':python3-venv")  # Debian ships venv separately
if [ $want_test -eq 1 ]; then
    wanted+=(
        "command -v prometheus:prometheus"
        "command -v prometheus-node-exporter:prometheus-node-exporter"
        "command -v lstopo-no-graphics:hwloc-nox"
        "command -v strace:strace"
        "command -v openssl:openssl"
        "command -v curl:curl"
    )
fi
mapfile -t packages < <(missing_packages "${wanted[@]}")
apt_install "${packages[@]}"

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
extras=""
[ $want_test -eq 1 ] && extras="[test]"
stamp=".venv/.installed$extras"
digest="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
    pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
    "${pip[@]}" --upgrade pip >/dev/null
    # the exact releases of constraints.txt: the ones the agent (and its accelerated path) was proven on.
    # uv installs them in seconds where pip takes most of a minute; uv reads no pip.conf, so where it
    # cannot reach the index pip does the work. uv trusts the system's certificates, as pip does (a proxy's
    # CA installed there). Both compile the modules now: with PYTHONDONTWRITEBYTECODE set, every process
    # would compile them again at each start.
    "${pip[@]}" -c constraints.txt uv >/dev/null
    uv=(.venv/bin/python -m uv pip install -q --system-certs --compile-bytecode --python .venv/bin/python)
    if ! "${uv[@]}" -c constraints.txt -e ".$extras"; then
        echo "setup: uv could not install the packages; installing them with pip" >&2
        "${pip[@]}" -c constraints.txt -e ".$extras"
    fi
    echo "$digest" > "$stamp"
fi

# Further test tools, each with its own idempotent script (helm/kubectl, podman, TLS terminators, ...).
if [ $want_test -eq 1 ]; then
    for extra in scripts/setup.d/*.sh; do
        if [ -e "$extra" ]; then bash "$extra"; fi
    done
fi
