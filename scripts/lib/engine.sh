# Shared by scripts/build-image.sh and scripts/stack.sh: the container engine and the agent's base image.
# Sourced, not run. Messages go to stderr, prefixed with the calling script's name.

SETUP_PODMAN_HOME="${OTEL_NUMA_PODMAN_HOME:-/var/lib/otel-numa-podman}"  # scripts/setup.d/podman.sh's store
SETUP_BASE_IMAGE=localhost/otel-numa-base:bookworm-1                    # the Debian base it makes there
# OTEL_NUMA_IMAGE_LEDGER: a file that gets one line per image made or fetched here ("STORE IMAGE", STORE
# "default" or "setup"), so that scripts/stack.sh down --images removes what its up added.

say() { echo "$(basename "$0" .sh): $*" >&2; }
die() { say "error: $*"; exit 1; }

# docker when its engine answers, else podman; OTEL_NUMA_ENGINE forces one.
pick_engine() {
    local wanted="${OTEL_NUMA_ENGINE:-}"
    case "$wanted" in
        docker|podman) command -v "$wanted" >/dev/null || die "OTEL_NUMA_ENGINE=$wanted: $wanted is not installed"
                       echo "$wanted"; return ;;
        "") ;;
        *) die "OTEL_NUMA_ENGINE=$wanted: use docker or podman" ;;
    esac
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        echo docker
    elif command -v podman >/dev/null; then
        echo podman
    else
        die "neither a Docker engine nor podman is available: install one of them"
    fi
}

image_present() { "$1" image inspect "$2" >/dev/null 2>&1; }

record_image() {  # store, image
    [ -n "${OTEL_NUMA_IMAGE_LEDGER:-}" ] && echo "$1 $2" >> "$OTEL_NUMA_IMAGE_LEDGER"
    return 0
}

setup_podman() {  # podman with the setup's own configuration and store
    CONTAINERS_CONF="$SETUP_PODMAN_HOME/containers.conf" CONTAINERS_STORAGE_CONF="$SETUP_PODMAN_HOME/storage.conf" \
        podman "$@"
}

# Pulls $2 unless present; on failure prints the engine's last error line to stdout and returns 1.
fetch_image() {
    local engine="$1" image="$2" output
    image_present "$engine" "$image" && return 0
    say "pulling $image"
    if output="$("$engine" pull "$image" 2>&1 >/dev/null)"; then
        record_image default "$image"
        return 0
    fi
    printf '%s\n' "$output" | grep -v '^\s*$' | tail -n 1
    return 1
}

# The default BASE_IMAGE of the Dockerfile.
dockerfile_base() { sed -n 's/^ARG BASE_IMAGE=//p' Dockerfile; }

# Copies the setup's base image from its private store into podman's default store (this machine's case:
# no registry, and setup.d/podman.sh keeps the base apart from the default store).
copy_setup_base() {
    [ -f "$SETUP_PODMAN_HOME/storage.conf" ] || return 1
    setup_podman image exists "$SETUP_BASE_IMAGE" 2>/dev/null || return 1
    say "copying $SETUP_BASE_IMAGE from $SETUP_PODMAN_HOME (scripts/setup.d/podman.sh) into podman's default store"
    setup_podman save --format oci-archive "$SETUP_BASE_IMAGE" | podman load >/dev/null
    record_image default "$SETUP_BASE_IMAGE"
}

# Makes the Debian base with scripts/setup.d/podman.sh (root: apt-get and debootstrap), where nothing else
# gives one; returns 1 when that cannot be done here.
make_setup_base() {
    [ "$(id -u)" -eq 0 ] || return 1
    command -v apt-get >/dev/null || return 1
    local had=0
    [ -f "$SETUP_PODMAN_HOME/storage.conf" ] && setup_podman image exists "$SETUP_BASE_IMAGE" 2>/dev/null && had=1
    say "making the Debian base image $SETUP_BASE_IMAGE with debootstrap (scripts/setup.d/podman.sh, about a minute)"
    bash scripts/setup.d/podman.sh >&2 || return 1
    [ $had = 1 ] || record_image setup "$SETUP_BASE_IMAGE"
}

# The base image to build on: the one asked for, else the Dockerfile's, else the local Debian base.
pick_base_image() {
    local engine="$1" asked="$2" official why
    if [ -n "$asked" ]; then
        why="$(fetch_image "$engine" "$asked")" || die "base image $asked: $why"
        echo "$asked"; return
    fi
    official="$(dockerfile_base)"
    if why="$(fetch_image "$engine" "$official")"; then
        echo "$official"; return
    fi
    say "base image $official cannot be had ($why)"
    if image_present "$engine" "$SETUP_BASE_IMAGE" \
        || { [ "$engine" = podman ] && copy_setup_base && image_present podman "$SETUP_BASE_IMAGE"; } \
        || { [ "$engine" = podman ] && make_setup_base && copy_setup_base; }; then
        say "building on the local Debian base $SETUP_BASE_IMAGE instead"
        echo "$SETUP_BASE_IMAGE"; return
    fi
    die "no base image: give one with OTEL_NUMA_BASE_IMAGE=IMAGE (Python 3.11+ with pip), or make the" \
        "Debian one with: sudo bash scripts/setup.d/podman.sh"
}
