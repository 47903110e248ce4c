#!/usr/bin/env bash
# Runs every fuzz target of every package of the root module for a short time.
# Usage: scripts/fuzz.sh [fuzztime]   (default 10s per target)
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
n=0
for pkg in $(go list ./...); do
	targets=$(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
	for t in $targets; do
		echo "== $pkg $t ($fuzztime)"
		go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" "$pkg"
		n=$((n + 1))
	done
done
echo "fuzzed $n targets"
