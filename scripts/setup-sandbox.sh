#!/usr/bin/env bash
# Install bubblewrap (`bwrap`), which the namespace sandbox (agents/sandbox/namespace.py) runs agents under.
# Idempotent and quiet: does nothing when bwrap is already on PATH. Needs root (or sudo) to install.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup-sandbox] bwrap is missing and apt-get is not available: install bubblewrap with your package manager" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
echo "[setup-sandbox] installing bubblewrap"
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
command -v bwrap >/dev/null
