#!/usr/bin/env bash
# The local demo stack of docker-compose.yaml: the agent (built here), the OpenTelemetry Collector,
# Prometheus and Grafana, with Docker or with podman (no Docker engine, no registry needed).
#
#   bash scripts/stack.sh up       build the agent's image, start what can run, print the URLs
#   bash scripts/stack.sh status   what runs, and the URLs
#   bash scripts/stack.sh down     stop and remove every container and network of the stack
#
# An image that can be neither found locally nor pulled is skipped, with the reason. Prometheus, the one
# the demo needs, falls back to Debian's prometheus package built into a local image on the agent's base.
# Settings (environment): OTEL_NUMA_ENGINE=docker|podman, OTEL_NUMA_CA_BUNDLE (a TLS-intercepting proxy's
# CA for the build; PIP_CERT is used when set), OTEL_NUMA_BASE_IMAGE, OTEL_NUMA_STACK_PROJECT (compose
# project, default otel-numa-demo), OTEL_NUMA_STACK_{AGENT,HEALTH,PROMETHEUS,GRAFANA,COLLECTOR}_PORT
# (loopback ports, default 9464, 9465, 9090, 3000, 8889) and OTEL_NUMA_STACK_OTLP_{GRPC,HTTP}_PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/engine.sh
source scripts/lib/engine.sh

PROJECT="${OTEL_NUMA_STACK_PROJECT:-otel-numa-demo}"
AGENT_IMAGE=otel-numa:dev
FALLBACK_PROMETHEUS=localhost/otel-numa-prometheus:bookworm
STATE="${TMPDIR:-/tmp}/otel-numa-stack-$PROJECT"
OVERRIDE="$STATE/override.yaml"

# The compose command of the engine: docker compose, else podman-compose (PATH, then the project's .venv).
compose_command() {
    if [ "$1" = docker ]; then
        echo "docker compose"
    elif command -v podman-compose >/dev/null; then
        echo podman-compose
    elif [ -x .venv/bin/podman-compose ]; then
        echo .venv/bin/podman-compose
    else
        die "podman-compose is not installed: pip install podman-compose (or apt-get install podman-compose)"
    fi
}

# The image of a service in docker-compose.yaml.
service_image() {
    awk -v service="$1" '
        /^  [a-z][a-z0-9-]*:$/ { current = substr($1, 1, length($1) - 1) }
        current == service && /^    image: / { print $2; exit }
    ' docker-compose.yaml
}

compose() {
    local files=(-f docker-compose.yaml)
    [ -f "$OVERRIDE" ] && files+=(-f "$OVERRIDE")
    # shellcheck disable=SC2086  # "docker compose" is two words
    $COMPOSE --project-name "$PROJECT" "${files[@]}" "$@"
}

wait_ready() {  # url, seconds
    local deadline=$((SECONDS + $2))
    while [ $SECONDS -lt $deadline ]; do
        if command -v curl >/dev/null; then
            curl -sf -o /dev/null "$1" && return 0
        elif command -v wget >/dev/null; then
            wget -q -O /dev/null "$1" && return 0
        else
            return 0
        fi
        sleep 1
    done
    return 1
}

print_urls() {
    local started="$1"
    say "open:"
    say "  agent page        http://127.0.0.1:${OTEL_NUMA_STACK_AGENT_PORT:-9464}/metrics"
    say "  agent health      http://127.0.0.1:${OTEL_NUMA_STACK_HEALTH_PORT:-9465}/readyz"
    [[ " $started " == *" prometheus "* ]] &&
        say "  Prometheus        http://127.0.0.1:${OTEL_NUMA_STACK_PROMETHEUS_PORT:-9090}/graph?g0.expr=numa_cpu_allocated"
    [[ " $started " == *" grafana "* ]] &&
        say "  Grafana           http://127.0.0.1:${OTEL_NUMA_STACK_GRAFANA_PORT:-3000}/  (dashboard otel-numa)"
    [[ " $started " == *" otel-collector "* ]] &&
        say "  Collector page    http://127.0.0.1:${OTEL_NUMA_STACK_COLLECTOR_PORT:-8889}/metrics"
    say "stop it with: bash scripts/stack.sh down"
}

up() {
    mkdir -p "$STATE"
    rm -f "$OVERRIDE"
    bash scripts/build-image.sh --engine "$ENGINE" --tag "$AGENT_IMAGE" >/dev/null

    local started=(agent) skipped=() service image why fallback=""
    for service in otel-collector prometheus grafana; do
        image="$(service_image "$service")"
        if why="$(fetch_image "$ENGINE" "$image")"; then
            started+=("$service")
        elif [ "$service" = prometheus ]; then
            say "prometheus: the image $image cannot be had ($why)"
            say "prometheus: FALLBACK: running Debian's prometheus package instead, as $FALLBACK_PROMETHEUS"
            if ! image_present "$ENGINE" "$FALLBACK_PROMETHEUS"; then
                "$ENGINE" build --tag "$FALLBACK_PROMETHEUS" \
                    --build-arg "BASE_IMAGE=$(pick_base_image "$ENGINE" "${OTEL_NUMA_BASE_IMAGE:-}")" \
                    -f config/compose/prometheus-debian.Dockerfile config/compose >&2
            fi
            fallback="$FALLBACK_PROMETHEUS"
            started+=(prometheus)
        else
            skipped+=("$service: the image $image cannot be had ($why)")
        fi
    done
    if [[ " ${started[*]} " != *" otel-collector "* ]]; then
        # nothing to push OTLP to: the agent serves its page only
        export OTEL_NUMA_STACK_EXPORTERS=prometheus
    fi
    # podman's default open-file and process limits may exceed what the host lets a container have (the
    # start then fails with "error setting rlimit"): the host's own open-file limit, and 4096 processes
    local nofile nproc=4096
    nofile="$(ulimit -Hn)"
    [ "$nofile" = unlimited ] && nofile=1048576
    {
        echo "# written by scripts/stack.sh up for project $PROJECT"
        echo "x-podman:"
        echo "  in_pod: false"
        echo "services:"
        for service in "${started[@]}"; do
            echo "  $service:"
            if [ "$service" = prometheus ] && [ -n "$fallback" ]; then
                echo "    image: $fallback"
            fi
            if [ "$ENGINE" = podman ]; then
                echo "    ulimits:"
                echo "      nofile: {soft: $nofile, hard: $nofile}"
                echo "      nproc: {soft: $nproc, hard: $nproc}"
                # podman runs health checks from systemd timers: without systemd they only log errors
                [ -d /run/systemd/system ] || echo "    healthcheck: {disable: true}"
            fi
        done
    } > "$OVERRIDE"
    printf '%s\n' "${started[@]}" > "$STATE/services"

    compose up --detach --no-build --no-deps "${started[@]}" >&2
    say "started on $ENGINE: ${started[*]}"
    local reason
    for reason in "${skipped[@]}"; do
        say "skipped $reason"
    done
    if [[ " ${started[*]} " == *" prometheus "* ]]; then
        wait_ready "http://127.0.0.1:${OTEL_NUMA_STACK_PROMETHEUS_PORT:-9090}/-/ready" 60 ||
            say "Prometheus is not ready after 60 s: bash scripts/stack.sh status"
    fi
    wait_ready "http://127.0.0.1:${OTEL_NUMA_STACK_HEALTH_PORT:-9465}/readyz" 60 ||
        say "the agent is not ready after 60 s: $ENGINE logs ${PROJECT}_agent_1"
    print_urls "${started[*]}"
}

leftovers() {
    local label=com.docker.compose.project
    [ "$ENGINE" = podman ] && label=io.podman.compose.project
    "$ENGINE" ps --all --quiet --filter "label=$label=$PROJECT"
}

down() {
    compose down --timeout 5 >/dev/null 2>&1 || true  # it names services that never started
    local left
    left="$(leftovers)"
    if [ -n "$left" ]; then
        # shellcheck disable=SC2086  # one id per word
        "$ENGINE" rm --force $left >/dev/null
    fi
    "$ENGINE" network rm "${PROJECT}_default" >/dev/null 2>&1 || true
    rm -rf "$STATE"
    [ -z "$(leftovers)" ] || die "containers of $PROJECT are still there: $ENGINE ps --all"
    say "stopped: no container of $PROJECT is left"
}

status() {
    compose ps >&2
    if [ -z "$(leftovers)" ]; then
        say "the stack $PROJECT is not running: bash scripts/stack.sh up"
        return 0
    fi
    print_urls "$(tr '\n' ' ' < "$STATE/services" 2>/dev/null || echo agent)"
}

ENGINE="$(pick_engine)"
COMPOSE="$(compose_command "$ENGINE")"
case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) die "usage: bash scripts/stack.sh up|status|down" ;;
esac
