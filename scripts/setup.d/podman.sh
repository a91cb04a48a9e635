#!/usr/bin/env bash
# Tools for the container image test (tests/deploy/test_image.py) and for scripts/stack.sh where no registry
# answers: Debian's podman with runc, debootstrap, and Python base images (native, and arm64 under emulation
# with qemu-user-static) made locally with debootstrap. This podman state lives apart from the machine's
# own, in $PODMAN_HOME, with its own configuration files:
#   $PODMAN_HOME/containers.conf, $PODMAN_HOME/storage.conf  (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF)
# The base images are kept there between runs, so a repeat run costs only the image build.
# OTEL_NUMA_PODMAN_HOME and OTEL_NUMA_PODMAN_RUN move that state (the stack's fresh-machine test does).
set -euo pipefail

PODMAN_HOME="${OTEL_NUMA_PODMAN_HOME:-/var/lib/otel-numa-podman}"
PODMAN_RUN="${OTEL_NUMA_PODMAN_RUN:-/run/otel-numa-podman}"
# Bump the tag when the recipe below changes: an image with the current tag is never rebuilt.
BASE_IMAGE=localhost/otel-numa-base:bookworm-1
BASE_IMAGE_ARM64=localhost/otel-numa-base:bookworm-1-arm64
BASE_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
DEBIAN_MIRROR=http://deb.debian.org/debian

# crun fails on a hybrid cgroup v1/v2 layout: runc. netavark and aardvark-dns give the compose network
# its name resolution.
wanted=()
packages=(podman runc debootstrap netavark aardvark-dns iptables)
# The emulator only where an arm64 base is wanted: asked for, or kept from an earlier run (see below).
want_arm64=0
if [ "$(dpkg --print-architecture)" = amd64 ]; then
    if [ "${OTEL_NUMA_TEST_ARM64:-0}" = 1 ]; then
        want_arm64=1
    elif [ -f "$PODMAN_HOME/storage.conf" ] && command -v podman >/dev/null \
        && CONTAINERS_STORAGE_CONF="$PODMAN_HOME/storage.conf" podman image exists "$BASE_IMAGE_ARM64" 2>/dev/null; then
        want_arm64=1
    fi
fi
[ $want_arm64 = 1 ] && packages+=(qemu-user-static)
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || wanted+=("$package")
done
if [ ${#wanted[@]} -gt 0 ]; then
    echo "setup: apt-get install ${wanted[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null
fi

mkdir -p "$PODMAN_HOME/storage" "$PODMAN_HOME/networks" "$PODMAN_RUN"
cat > "$PODMAN_HOME/storage.conf.new" <<EOF
[storage]
driver = "overlay"
graphroot = "$PODMAN_HOME/storage"
runroot = "$PODMAN_RUN/storage"
EOF
# No systemd here: cgroupfs, events to a file. podman's default open-file and process limits are above
# what this machine allows, so containers get limits within it.
cat > "$PODMAN_HOME/containers.conf.new" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$PODMAN_RUN/events.log"
tmp_dir = "$PODMAN_RUN/libpod"

[network]
network_backend = "netavark"
network_config_dir = "$PODMAN_HOME/networks"
EOF
for name in storage.conf containers.conf; do
    if cmp -s "$PODMAN_HOME/$name.new" "$PODMAN_HOME/$name"; then
        rm "$PODMAN_HOME/$name.new"
    else
        mv "$PODMAN_HOME/$name.new" "$PODMAN_HOME/$name"
    fi
done
export CONTAINERS_CONF="$PODMAN_HOME/containers.conf" CONTAINERS_STORAGE_CONF="$PODMAN_HOME/storage.conf"

# The Debian Python stands in for the official python image: `python` on the PATH (the HEALTHCHECK
# calls it) and no PEP 668 marker, so that pip may install the agent into the system Python.
make_base() {
    local arch="$1" tag="$2"
    podman image exists "$tag" && return 0
    echo "setup: debootstrap $tag ($arch; a minute natively, about 8 under emulation)" >&2
    local work
    work="$(mktemp -d /var/tmp/otel-numa-base.XXXXXX)"
    if ! debootstrap --arch="$arch" --variant=minbase --include="$BASE_PACKAGES" bookworm "$work/root" \
        "$DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1; then
        tail -20 "$work/debootstrap.log" >&2
        rm -rf "$work"
        return 1
    fi
    rm -f "$work"/root/usr/lib/python3*/EXTERNALLY-MANAGED
    rm -rf "$work"/root/var/cache/apt/archives/*.deb "$work"/root/var/lib/apt/lists/* \
        "$work"/root/usr/share/doc/* "$work"/root/usr/share/man/* "$work"/root/usr/share/locale/*
    tar --numeric-owner -C "$work/root" -c . | podman import --quiet --arch "$arch" \
        --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$tag" >/dev/null
    rm -rf "$work"
    echo "setup: $tag is $(podman image inspect --format '{{.Size}}' "$tag") bytes" >&2
}

make_base "$(dpkg --print-architecture)" "$BASE_IMAGE"

# An arm64 build under emulation: qemu-user-static's handler registered with binfmt_misc (flag F, so it
# works inside containers). Where the kernel does not allow it the image test says so and skips that part.
# Making the emulated base takes about 8 minutes, once: it is made when OTEL_NUMA_TEST_ARM64=1 (or kept
# from an earlier run), so that a first run on a new machine stays quick.
if [ $want_arm64 = 1 ]; then
    binfmt=/proc/sys/fs/binfmt_misc
    mountpoint -q "$binfmt" || mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
    if [ -w "$binfmt/register" ] && [ ! -e "$binfmt/qemu-aarch64" ]; then
        cat /usr/lib/binfmt.d/qemu-aarch64.conf > "$binfmt/register" 2>/dev/null || true
    fi
    if [ -e "$binfmt/qemu-aarch64" ]; then
        make_base arm64 "$BASE_IMAGE_ARM64"
    else
        echo "setup: no binfmt_misc handler for arm64 here: the image test skips the arm64 build" >&2
    fi
fi
