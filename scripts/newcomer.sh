#!/usr/bin/env bash
# The newcomer's path, so the README cannot drift from the product: clone the repository
# into a temporary directory and run the README's "First run" block there, literally,
# line by line, in one bash (so its `. .venv/bin/activate` holds for the lines after it).
# Any failing line fails the script. Then the clone must still be clean: the commands
# may write only ignored paths (.venv/, var/); `rankwatch grafana build` rewriting a
# committed board would show here.
#
#   scripts/newcomer.sh [REPO]     (default: this checkout; its committed HEAD is cloned)
#
# Needs what the README says (Python 3.11, network or a pip cache). PIP_CACHE_DIR is kept
# from the caller, so CI shares its downloads with `make test` (.ci/run sets it).
set -euo pipefail
repo="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The first ```sh block after the heading "## First run" of the README.
block="$(awk '
    /^## First run/ { section = 1; next }
    section && /^## / { exit }
    section && /^```sh/ { inside = 1; next }
    inside && /^```/ { exit }
    inside { print }
' "$repo/README.md")"
if [ -z "$block" ]; then
    echo "newcomer.sh: README.md has no sh block under '## First run'" >&2
    exit 1
fi

git clone --quiet "$repo" "$work/rankwatch"
cd "$work/rankwatch"
echo "newcomer.sh: the README's first run, in a fresh clone at $work/rankwatch"
started=$SECONDS
# -x echoes each command as it runs: the log shows which line failed
bash -euxo pipefail -c "$block"
if [ -n "$(git status --porcelain)" ]; then
    echo "newcomer.sh: the README's commands changed committed files:" >&2
    git status --porcelain >&2
    exit 1
fi
echo "newcomer.sh: the README's first run passed in $((SECONDS - started)) s"
