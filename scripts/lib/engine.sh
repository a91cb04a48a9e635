# Shared by scripts/build-image.sh and scripts/stack.sh: the container engine and the agent's base image.
# Sourced, not run. Messages go to stderr, prefixed with the calling script's name.

SETUP_PODMAN_HOME=/var/lib/otel-numa-podman          # scripts/setup.d/podman.sh's own store
SETUP_BASE_IMAGE=localhost/otel-numa-base:bookworm-1  # the Debian base it makes there

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

# Pulls $2 unless present; on failure prints the engine's last error line to stdout and returns 1.
fetch_image() {
    local engine="$1" image="$2" output
    image_present "$engine" "$image" && return 0
    if output="$("$engine" pull "$image" 2>&1 >/dev/null)"; then
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
    CONTAINERS_CONF="$SETUP_PODMAN_HOME/containers.conf" CONTAINERS_STORAGE_CONF="$SETUP_PODMAN_HOME/storage.conf" \
        podman image exists "$SETUP_BASE_IMAGE" 2>/dev/null || return 1
    say "copying $SETUP_BASE_IMAGE from $SETUP_PODMAN_HOME (scripts/setup.d/podman.sh) into podman's default store"
    CONTAINERS_CONF="$SETUP_PODMAN_HOME/containers.conf" CONTAINERS_STORAGE_CONF="$SETUP_PODMAN_HOME/storage.conf" \
        podman save --format oci-archive "$SETUP_BASE_IMAGE" | podman load >/dev/null
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
        || { [ "$engine" = podman ] && copy_setup_base && image_present podman "$SETUP_BASE_IMAGE"; }; then
        say "building on the local Debian base $SETUP_BASE_IMAGE instead"
        echo "$SETUP_BASE_IMAGE"; return
    fi
    die "no base image: give one with OTEL_NUMA_BASE_IMAGE=IMAGE (Python 3.11+ with pip), or make the" \
        "Debian one with: sudo bash scripts/setup.d/podman.sh"
}
