#!/usr/bin/env bash
# Make the Docker sandbox (agents/sandbox/docker/) usable here: install docker.io, start a daemon when none
# answers, and build the test image offline (no registry is reachable): a debootstrap'd minimal Debian root with
# python3 (the in-container half of agents/sandbox/netbridge.py needs it) and git (SWE set-up and grading), imported as
# $IMAGE.
# Idempotent: each step is skipped when already done. Needs root. Exits non-zero, saying why, when no daemon can run.
set -euo pipefail
IMAGE="interceptor/debian-python:bookworm"  # tests/agents/test_docker_sandbox.py runs in it
SUITE="bookworm"
MIRROR="http://deb.debian.org/debian"
LOG_DIR="/var/log/interceptor"

say() { echo "[setup-docker] $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    say "needs root (it installs packages and starts dockerd)"
    exit 1
fi
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A daemon without iptables or a bridge: sandboxes run with --network none, so none is needed, and the host's
# firewall is left alone.
start_daemon() {
    mkdir -p "$LOG_DIR"
    say "starting dockerd $* (log: $LOG_DIR/dockerd.log)"
    # its own session, no inherited descriptors: a caller that waits for its output pipes never waits on it
    setsid nohup dockerd --iptables=false --ip6tables=false --bridge=none "$@" </dev/null >"$LOG_DIR/dockerd.log" 2>&1 &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && return 0
        kill -0 $! 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}
if ! docker info >/dev/null 2>&1; then
    if ! start_daemon; then
        say "dockerd did not come up with overlay2; trying the vfs storage driver"
        if ! start_daemon --storage-driver=vfs; then
            say "no Docker daemon can run here:"
            tail -5 "$LOG_DIR/dockerd.log" >&2
            exit 1
        fi
    fi
fi

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    root="$(mktemp -d)"
    trap 'rm -rf "$root"' EXIT
    say "building $IMAGE from $SUITE (debootstrap minbase + python3, git)"
    if ! debootstrap --variant=minbase --include=python3,git "$SUITE" "$root/rootfs" "$MIRROR" >"$root/log" 2>&1; then
        tail -20 "$root/log" >&2
        exit 1
    fi
    tar -C "$root/rootfs" -c . | docker import \
        -c "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" - "$IMAGE" >/dev/null
fi
docker run --rm --network none "$IMAGE" python3 -c 'pass'
