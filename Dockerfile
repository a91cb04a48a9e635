# syntax=docker/dockerfile:1
# otel-numa node agent image.
#
# Build:  bash scripts/build-image.sh            (Docker or podman; prints the helm install line)
#         docker build -t otel-numa:dev .
#         podman build --format docker -t otel-numa:dev .   (docker format: OCI drops the HEALTHCHECK)
# Behind a proxy with its own CA, give pip that CA as the build secret "ca-bundle" (never a layer):
#         docker build --secret id=ca-bundle,src=/path/to/ca-bundle.pem -t otel-numa:dev .
# BASE_IMAGE may name any Debian-like image with `python` (3.11 or newer) and pip on the PATH, e.g. one
# made locally with debootstrap (see scripts/setup.d/podman.sh): --build-arg BASE_IMAGE=...
# The builder stage turns the project and every dependency into wheels; the final stage installs
# those wheels only (no compiler, no source tree, no pip cache), so the image holds what runs.

ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# pyproject.toml names README.md as the long description, so the build needs it.
COPY pyproject.toml README.md constraints.txt ./
COPY otel_numa/ otel_numa/
# The optional secret "ca-bundle" is a PEM bundle pip trusts instead of its own (a TLS-intercepting proxy).
# constraints.txt: the exact releases the agent and its accelerated export path were proven on.
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && pip wheel --wheel-dir /wheels --constraint constraints.txt .


FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="otel-numa" \
      org.opencontainers.image.description="Per-NUMA capacity, allocation and usage of a Kubernetes node, exported through OpenTelemetry" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The wheels are bind-mounted for this one step so that they never become a layer of the image.
# pip compiles the bytecode here, which matters because the agent runs on a read-only root file system.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels otel-numa

# Non-root by default: enough for sysfs, procfs and cgroup files, which are world-readable.
# Reading the kubelet's root-owned 0600 checkpoints and connecting to its pod-resources socket needs
# UID 0; the Kubernetes DaemonSet sets runAsUser: 0 with every capability dropped (see
# config/kubernetes/daemonset.yaml for the reasons).
USER 65532:65532

# 9464: Prometheus exposition (--prometheus-address); 9465: /healthz and /readyz (--health-address).
EXPOSE 9464 9465

# The slim image has no curl; the standard library is enough. Assumes the default --health-address port.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9465/healthz', timeout=3)"]

ENTRYPOINT ["otel-numa"]
