#!/usr/bin/env bash
# Builds the agent's container image with Docker or podman, tags it, optionally pushes it, and prints the
# commands that deploy it with the Helm chart (docs/kubernetes.md): the namespace labelled for the agent's
# hostPath volumes (Pod Security "privileged"), then `helm install`.
#
#   bash scripts/build-image.sh [--tag NAME:TAG] [--push] [--engine docker|podman] [--base IMAGE] [--no-deploy]
#
#   --tag NAME:TAG   default otel-numa:dev; name your registry to deploy it (registry.example/otel-numa:0.1.0)
#   --push           push the tag after the build (the nodes pull it from there)
#   --engine         default: docker when a Docker engine answers, else podman (OTEL_NUMA_ENGINE)
#   --no-deploy      leave out the deploy steps (scripts/stack.sh runs the image here)
#   --base IMAGE     the Python base image (OTEL_NUMA_BASE_IMAGE); default: the Dockerfile's
#                    python:3.11 slim image; where no registry answers, podman uses the Debian base that
#                    scripts/setup.d/podman.sh makes (copied into podman's default store)
#
# Behind a proxy with its own CA, pip needs that CA: OTEL_NUMA_CA_BUNDLE=/path/to/bundle.pem (else PIP_CERT
# is used when set). It reaches the build as the secret "ca-bundle" and never becomes a layer.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/engine.sh
source scripts/lib/engine.sh

tag=otel-numa:dev
push=0
deploy=1
base="${OTEL_NUMA_BASE_IMAGE:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) tag="$2"; shift 2 ;;
        --tag=*) tag="${1#*=}"; shift ;;
        --push) push=1; shift ;;
        --no-deploy) deploy=0; shift ;;
        --engine) OTEL_NUMA_ENGINE="$2"; shift 2 ;;
        --engine=*) OTEL_NUMA_ENGINE="${1#*=}"; shift ;;
        --base) base="$2"; shift 2 ;;
        --base=*) base="${1#*=}"; shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

engine="$(pick_engine)"
base="$(pick_base_image "$engine" "$base")"

build_args=(build --tag "$tag" --build-arg "BASE_IMAGE=$base")
# podman's default OCI format drops the HEALTHCHECK; docker format keeps it. podman (4.x) keys a cached
# RUN by its text alone, not by what its --mount from the builder stage holds: a cached install step can
# keep an older agent, and a cached builder stage has failed the install (no otel-numa wheel). Its builds
# run without the layer cache and leave no intermediate images (pip fetches the wheels again, some seconds).
[ "$engine" = podman ] && build_args+=(--format docker --layers=false)
ca_bundle="${OTEL_NUMA_CA_BUNDLE:-${PIP_CERT:-}}"
if [ -n "$ca_bundle" ]; then
    [ -r "$ca_bundle" ] || die "the CA bundle $ca_bundle (OTEL_NUMA_CA_BUNDLE or PIP_CERT) cannot be read"
    say "pip in the build trusts the CA bundle $ca_bundle"
    build_args+=(--secret "id=ca-bundle,src=$ca_bundle")
fi

say "building $tag with $engine on $base"
started=$SECONDS
"$engine" "${build_args[@]}" . >&2
say "built $tag in $((SECONDS - started)) s"

if [ $push -eq 1 ]; then
    say "pushing $tag"
    "$engine" push "$tag" >&2
fi

[ $deploy = 1 ] || exit 0
repository="${tag%:*}"
image_tag="${tag##*:}"
if [ "$repository" = "$tag" ]; then image_tag=latest; fi
first="${repository%%/*}"
if [ "$first" = "$repository" ] || { [[ "$first" != *.* ]] && [[ "$first" != *:* ]]; } \
    || [ "$first" = localhost ]; then
    say "$tag exists only on this machine: to deploy it, tag it for a registry your nodes pull from and push it:"
    say "  bash scripts/build-image.sh --tag REGISTRY/otel-numa:$image_tag --push"
elif [ $push -eq 0 ]; then
    say "push it before installing: $engine push $tag"
fi
say "deploy it with:"
echo "kubectl create namespace otel-numa"
echo "kubectl label namespace otel-numa pod-security.kubernetes.io/enforce=privileged"
echo "helm install otel-numa config/helm/otel-numa --namespace otel-numa --set image.repository=$repository --set image.tag=$image_tag"
