# Prometheus from Debian's package, for the local stack where the upstream image cannot be pulled
# (scripts/stack.sh builds it on the agent's Debian base and says so). Debian's prometheus takes the same
# flags as the upstream image; only the version differs (bookworm ships 2.42).
ARG BASE_IMAGE=localhost/otel-numa-base:bookworm-1
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && install -d -o prometheus -g prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
