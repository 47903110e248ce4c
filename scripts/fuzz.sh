#!/usr/bin/env bash
# Runs every fuzz target of every package of the root module for a short time.
# Usage: scripts/fuzz.sh [fuzztime]   (default 10s per target)
#
# A real finding ("Failing input written to testdata/fuzz/...") fails at once.
# The Go fuzzing engine sometimes reports a bare "context deadline exceeded"
# when its workers are slow to stop at the end of -fuzztime on a loaded
# machine; such a run is retried once before it counts as a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
n=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for pkg in $(go list ./...); do
	targets=$(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
	for t in $targets; do
		for attempt in 1 2; do
			echo "== $pkg $t ($fuzztime)"
			if go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" "$pkg" >"$log" 2>&1; then
				tail -n 2 "$log"
				break
			fi
			cat "$log"
			if grep -q 'Failing input written' "$log" || ! grep -q 'context deadline exceeded' "$log" || [ "$attempt" = 2 ]; then
				echo "fuzz: $pkg $t failed" >&2
				exit 1
			fi
			echo "fuzz: $t stopped with the engine's shutdown timeout and no failing input; retrying once"
		done
		n=$((n + 1))
	done
done
echo "fuzzed $n targets"
