#!/usr/bin/env bash
# Headless Chromium for the HTML report's rendering test; Debian's package, installed once.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "ensure-chromium: run as root or install Debian's chromium" >&2; exit 1; fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
