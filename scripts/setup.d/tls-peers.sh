#!/usr/bin/env bash
# The TLS terminator that the OTLP-over-TLS tests put in front of rotel: Debian's nginx (gRPC and HTTP/2).
set -euo pipefail

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: please install the Debian package nginx" >&2
        exit 1
    fi
    echo "setup: apt-get install nginx" >&2
    apt-get update -qq
    # policy-rc.d keeps the package from starting a system nginx on port 80: the tests run their own.
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod +x "$policy"
        created_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null
    if [ $created_policy -eq 1 ]; then rm -f "$policy"; fi
fi
