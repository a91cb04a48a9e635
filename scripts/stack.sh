#!/usr/bin/env bash
# The local demo stack of docker-compose.yaml: the agent (built here) on a demo node with a podresources test
# server, the OpenTelemetry Collector, Prometheus (with the alert rules) and Grafana, with Docker or with
# podman (no Docker engine, no registry needed).
#
#   bash scripts/stack.sh up              install what is missing, build, start what can run, wait for the
#                                         first scrape, print the URLs
#   bash scripts/stack.sh status          what runs, and the URLs
#   bash scripts/stack.sh down            stop and remove every container, network and volume of the stack
#   bash scripts/stack.sh down --images   also remove the images that up built, pulled or copied
#
# What up installs when it is missing: podman-compose into the project's virtualenv .venv (pip; never the
# system's Python), and, where no registry gives a Python base image, the Debian base that
# scripts/setup.d/podman.sh makes with debootstrap (root). An image that can be neither found locally nor
# pulled is skipped, with the reason; Prometheus, the one the demo needs, falls back to Debian's prometheus
# package built into a local image on the agent's base.
# Settings (environment): OTEL_NUMA_ENGINE=docker|podman, OTEL_NUMA_CA_BUNDLE (a TLS-intercepting proxy's
# CA for pip and the build; PIP_CERT is used when set), OTEL_NUMA_BASE_IMAGE, OTEL_NUMA_STACK_PROJECT (compose
# project, default otel-numa-demo), OTEL_NUMA_STACK_{AGENT,HEALTH,PROMETHEUS,GRAFANA,COLLECTOR}_PORT
# (loopback ports, default 9464, 9465, 9090, 3000, 8889) and OTEL_NUMA_STACK_OTLP_{GRPC,HTTP}_PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/engine.sh
source scripts/lib/engine.sh

PROJECT="${OTEL_NUMA_STACK_PROJECT:-otel-numa-demo}"
AGENT_IMAGE=otel-numa:dev
FALLBACK_PROMETHEUS=localhost/otel-numa-prometheus:bookworm
COMPOSE_TOOL="podman-compose>=1.4"
STATE="${XDG_STATE_HOME:-$HOME/.local/state}/otel-numa/stack-$PROJECT"
OVERRIDE="$STATE/override.yaml"
LEDGER="$STATE/images"  # "STORE IMAGE" per line, written by up (and scripts/lib/engine.sh) for down --images
PROMETHEUS_PORT="${OTEL_NUMA_STACK_PROMETHEUS_PORT:-9090}"
FIRST_QUERY=numa_cpu_allocated

# podman-compose from the project's virtualenv, installed there when missing: a distribution's older one
# (Debian's 1.0) starts services that were left out, and the system's pip refuses to install.
podman_compose() {
    local tool=.venv/bin/podman-compose
    if [ ! -x "$tool" ]; then
        if [ ! -x .venv/bin/python ]; then
            python3 -c 'import ensurepip, venv' 2>/dev/null \
                || die "python3-venv is missing (it makes .venv, where podman-compose goes): apt-get install python3-venv"
            say "creating the project's virtualenv .venv (python3 -m venv)"
            python3 -m venv .venv >&2
        fi
        local pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
        [ -f constraints.txt ] && pip+=(-c constraints.txt)
        [ -n "${OTEL_NUMA_CA_BUNDLE:-}" ] && pip+=(--cert "$OTEL_NUMA_CA_BUNDLE")
        say "installing $COMPOSE_TOOL into .venv (pip, a few seconds; the system's Python is left alone)"
        "${pip[@]}" "$COMPOSE_TOOL" >&2 || die "pip could not install $COMPOSE_TOOL into .venv"
    fi
    echo "$tool"
}

# The compose command of the engine: docker compose, else the project's podman-compose.
compose_command() {
    if [ "$ENGINE" = docker ]; then
        docker compose version >/dev/null 2>&1 \
            || die "the Docker Compose plugin is missing: install docker-compose-plugin, or use podman (OTEL_NUMA_ENGINE=podman)"
        echo "docker compose"
    else
        podman_compose
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

# Waits until a URL answers 200, or (with a PromQL expression) until Prometheus' answer to it is not empty.
wait_for() {  # seconds, url[, expression]
    python3 - "$@" <<'PY'
import json, sys, time, urllib.parse, urllib.request

seconds, url = float(sys.argv[1]), sys.argv[2]
expression = sys.argv[3] if len(sys.argv) > 3 else None
if expression is not None:
    url += "/api/v1/query?query=" + urllib.parse.quote(expression)
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            if expression is None or json.load(answer)["data"]["result"]:
                sys.exit(0)
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(1)
sys.exit(1)
PY
}

print_urls() {
    local started="$1"
    say "open:"
    say "  agent page        http://127.0.0.1:${OTEL_NUMA_STACK_AGENT_PORT:-9464}/metrics"
    say "  agent health      http://127.0.0.1:${OTEL_NUMA_STACK_HEALTH_PORT:-9465}/readyz"
    if [[ " $started " == *" prometheus "* ]]; then
        say "  Prometheus        http://127.0.0.1:$PROMETHEUS_PORT/graph?g0.expr=$FIRST_QUERY"
        say "  alert rules       http://127.0.0.1:$PROMETHEUS_PORT/rules"
    fi
    [[ " $started " == *" grafana "* ]] &&
        say "  Grafana           http://127.0.0.1:${OTEL_NUMA_STACK_GRAFANA_PORT:-3000}/  (dashboard otel-numa)"
    [[ " $started " == *" otel-collector "* ]] &&
        say "  Collector page    http://127.0.0.1:${OTEL_NUMA_STACK_COLLECTOR_PORT:-8889}/metrics"
    say "stop it with: bash scripts/stack.sh down"
}

dangling_images() { "$ENGINE" images --quiet --no-trunc --filter dangling=true 2>/dev/null | sort -u; }

up() {
    mkdir -p "$STATE"
    rm -f "$OVERRIDE"
    say "engine: $ENGINE"
    COMPOSE="$(compose_command)"
    export OTEL_NUMA_IMAGE_LEDGER="$LEDGER"
    local dangling_before
    dangling_before="$(dangling_images)"
    say "building the agent's image $AGENT_IMAGE (scripts/build-image.sh)"
    bash scripts/build-image.sh --engine "$ENGINE" --tag "$AGENT_IMAGE" --no-deploy
    record_image default "$AGENT_IMAGE"

    local started=(podresources agent) skipped=() service image why fallback=""
    for service in otel-collector prometheus grafana; do
        image="$(service_image "$service")"
        if why="$(fetch_image "$ENGINE" "$image")"; then
            started+=("$service")
        elif [ "$service" = prometheus ]; then
            say "prometheus: the image $image cannot be had ($why)"
            say "prometheus: FALLBACK: running Debian's prometheus package instead, as $FALLBACK_PROMETHEUS"
            if ! image_present "$ENGINE" "$FALLBACK_PROMETHEUS"; then
                say "building $FALLBACK_PROMETHEUS (apt-get install prometheus on the agent's base)"
                "$ENGINE" build --tag "$FALLBACK_PROMETHEUS" \
                    --build-arg "BASE_IMAGE=$(pick_base_image "$ENGINE" "${OTEL_NUMA_BASE_IMAGE:-}")" \
                    -f config/compose/prometheus-debian.Dockerfile config/compose >&2
                record_image default "$FALLBACK_PROMETHEUS"
            fi
            fallback="$FALLBACK_PROMETHEUS"
            started+=(prometheus)
        else
            skipped+=("$service: the image $image cannot be had ($why)")
        fi
    done
    # the build stages the engine keeps untagged are the build's too
    comm -13 <(echo "$dangling_before") <(dangling_images) | while read -r id; do
        [ -n "$id" ] && record_image default "$id"
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

    say "starting ${started[*]}"
    compose up --detach --no-build --no-deps "${started[@]}" >&2
    say "started on $ENGINE: ${started[*]}"
    local reason
    for reason in "${skipped[@]}"; do
        say "skipped $reason"
    done
    wait_for 60 "http://127.0.0.1:${OTEL_NUMA_STACK_HEALTH_PORT:-9465}/readyz" ||
        say "the agent is not ready after 60 s: $ENGINE logs ${PROJECT}_agent_1"
    if [[ " ${started[*]} " == *" prometheus "* ]]; then
        say "waiting for Prometheus' first scrape of the agent (every 15 s)"
        wait_for 60 "http://127.0.0.1:$PROMETHEUS_PORT/-/ready" &&
            wait_for 60 "http://127.0.0.1:$PROMETHEUS_PORT" "$FIRST_QUERY" ||
            say "Prometheus has no $FIRST_QUERY after 2 minutes: bash scripts/stack.sh status"
    fi
    print_urls "${started[*]}"
}

leftovers() {
    local label=com.docker.compose.project
    [ "$ENGINE" = podman ] && label=io.podman.compose.project
    "$ENGINE" ps --all --quiet --filter "label=$label=$PROJECT"
}

# The images of the ledger that are still there, with their size in MB.
ledger_images() {
    [ -f "$LEDGER" ] || return 0
    local store image size
    sort -u "$LEDGER" | while read -r store image; do
        if [ "$store" = setup ]; then
            size="$(setup_podman image inspect --format '{{.Size}}' "$image" 2>/dev/null)" || continue
        else
            size="$("$ENGINE" image inspect --format '{{.Size}}' "$image" 2>/dev/null)" || continue
        fi
        echo "$store $image $((size / 1000000))"
    done
}

down() {
    local remove_images="$1"
    if [ -n "$(leftovers)" ] || [ -f "$STATE/services" ]; then
        COMPOSE="$(compose_command)"
        compose down --volumes --timeout 5 >/dev/null 2>&1 || true  # it names services that never started
    fi
    local left
    left="$(leftovers)"
    if [ -n "$left" ]; then
        # shellcheck disable=SC2086  # one id per word
        "$ENGINE" rm --force $left >/dev/null
    fi
    "$ENGINE" network rm "${PROJECT}_default" >/dev/null 2>&1 || true
    "$ENGINE" volume rm --force "${PROJECT}_podresources" >/dev/null 2>&1 || true
    rm -f "$OVERRIDE" "$STATE/services"
    [ -z "$(leftovers)" ] || die "containers of $PROJECT are still there: $ENGINE ps --all"
    say "stopped: no container of $PROJECT is left"

    local images total=0 store image size names=() kept=()
    images="$(ledger_images)"
    while read -r store image size; do
        [ -n "$image" ] || continue
        if [ "$remove_images" = 0 ]; then
            total=$((total + size)); names+=("$image")
        elif { [ "$store" = setup ] && setup_podman rmi "$image" >/dev/null 2>&1; } \
            || { [ "$store" = default ] && "$ENGINE" rmi "$image" >/dev/null 2>&1; }; then
            total=$((total + size)); names+=("$image")
        else
            kept+=("$image")  # in use by a container of another project, or tagged again since
        fi
    done <<< "$images"
    if [ "$remove_images" = 1 ]; then
        rm -f "$LEDGER"
        rmdir "$STATE" 2>/dev/null || true
        say "removed the ${#names[@]} images up made (${total} MB): ${names[*]:-none}"
        [ ${#kept[@]} -eq 0 ] || say "kept ${kept[*]}: in use ($ENGINE ps --all shows by what)"
    elif [ ${#names[@]} -gt 0 ]; then
        say "kept for the next up: the ${#names[@]} images up made (${total} MB): bash scripts/stack.sh down --images removes them"
    fi
}

status() {
    if [ -z "$(leftovers)" ]; then
        say "the stack $PROJECT is not running: bash scripts/stack.sh up"
        return 0
    fi
    COMPOSE="$(compose_command)"
    compose ps >&2
    print_urls "$(tr '\n' ' ' < "$STATE/services" 2>/dev/null || echo agent)"
}

ENGINE="$(pick_engine)"
COMPOSE=""
case "${1:-} ${2:-}" in
    "up ") up ;;
    "down ") down 0 ;;
    "down --images") down 1 ;;
    "status ") status ;;
    *) die "usage: bash scripts/stack.sh up|status|down [--images]" ;;
esac
