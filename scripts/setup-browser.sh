#!/usr/bin/env bash
# Install Debian's Chromium, which the viewer's browser tests (tests/viewer/test_viewer_browser.py) drive through
# Playwright (the Python package drives the system browser; no browser is downloaded). Idempotent and quiet: does
# nothing when /usr/bin/chromium is there. Needs root (or sudo) and apt-get; elsewhere the browser tests skip.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup-browser] no apt-get: install Chromium at /usr/bin/chromium to run the viewer's browser tests" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
echo "[setup-browser] installing chromium"
$sudo apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
test -x /usr/bin/chromium
