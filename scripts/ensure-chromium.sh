#!/usr/bin/env bash
# Headless Chromium (Debian's package) for the report rendering test.
# Idempotent: returns at once when it is already installed. apt's output (hundreds of
# lines) goes to a temporary log that is shown only when apt fails.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! {
    $SUDO apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
} >"$log" 2>&1; then
    echo "ensure-chromium.sh: apt-get failed; the last lines of its output:" >&2
    tail -n 40 "$log" >&2
    exit 1
fi
echo "ensure-chromium.sh: installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
