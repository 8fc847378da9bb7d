#!/usr/bin/env bash
# Local base images for `make deploy-run`, made from Debian's own packages: no image registry can be
# reached from the machines CI runs on, only Debian's mirror and PyPI. Idempotent (an image that exists
# is kept); about two minutes the first time. Needs root, debootstrap, podman and runc.
#   localhost/debian:bookworm               debootstrap --variant=minbase bookworm
#   localhost/python:3.11-slim-bookworm     + Debian's python3 (3.11), pip, venv (PEP 668: install into a venv)
#   localhost/postgres:15-bookworm          + postgresql-15 (no entrypoint: the caller runs initdb and postgres)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# The Debian mirror apt already uses on this machine.
mirror=$( { grep -rhoE 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true; } \
    | grep -v snapshot | head -1 | tr -d ' ')
[ -n "$mirror" ] || { echo "base-images: no Debian mirror in /etc/apt/sources.list*" >&2; exit 2; }

# runc, not crun (these machines have hybrid cgroups), and ulimits within the machine's hard limits.
run() { podman run --runtime /usr/sbin/runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$@"; }

if ! podman image exists localhost/debian:bookworm; then
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
    tar -C "$rootfs" -c . | podman import --quiet - localhost/debian:bookworm >/dev/null
fi

derive() {  # IMAGE PACKAGE...: localhost/debian:bookworm plus Debian's PACKAGEs, committed as IMAGE
    local image=$1 container
    shift
    podman image exists "$image" && return 0
    container=$(run -d localhost/debian:bookworm sleep 900)
    podman exec "$container" sh -c "apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $* >/dev/null \
        && rm -rf /var/lib/apt/lists/*"
    podman commit --quiet "$container" "$image" >/dev/null
    podman rm --force --time 0 "$container" >/dev/null
}
derive localhost/python:3.11-slim-bookworm python3 python3-pip python3-venv ca-certificates
derive localhost/postgres:15-bookworm postgresql-15 ca-certificates
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^localhost/' | sort
