#!/usr/bin/env bash
# scripts/bench.sh [COUNT] — runnel's benchmarks, with its codecs next to the
# official rocketmq-client-go's from the same run (`make bench`).
#
# 1. Benchmarks of the root module: every package with a Benchmark function.
# 2. internal/interop (nested module): benchmarks named .../impl=runnel and
#    .../impl=official. The official frame codec sits in the client's
#    internal/remote package, which no other module may import, and the
#    module cache cannot be overlaid, so this script copies the official
#    module (from `go list -m -f '{{.Dir}}'`) to .bench/official, adds the
#    shim files of internal/interop/testdata/officialshim (no upstream file is
#    changed), points a throw-away -modfile at the copy, and adds the
#    tagged benchmark file through -overlay. If that fails the official
#    frame rows are skipped and a warning says so.
#
# internal/interop's BenchmarkJavaPeer also runs Apache RocketMQ's own Java
# broker and Java client (internal/javapeer; it skips, saying why, without
# Java and Maven): its rows get two tables of their own, runnel's broker vs
# the Java broker (-col /broker) and runnel's client vs the official Java and
# Go clients (-col /impl).
#
# Raw output goes to .bench/ (gitignored). Then it prints the benchstat
# tables: runnel vs official side by side (-col /impl), the Java-peer
# tables, a SYNC_MASTER pair vs a single broker (-col /mode), and the rest.
#
# Environment: GO (go), COUNT (argument 1, default 6), BENCHTIME (per
# benchmark, default 250ms; the whole run takes a few minutes on 2 cores),
# BENCH (benchmark regexp, default .), TIMEOUT (go test -timeout, 60m).
set -euo pipefail

GO=${GO:-go}
COUNT=${1:-${COUNT:-6}}
BENCHTIME=${BENCHTIME:-250ms}
BENCH=${BENCH:-.}
# internal/e2e's scale-out benchmarks (multi-process ETL, failover, 100 MB
# hand-off) add about 3 minutes per count to that package.
TIMEOUT=${TIMEOUT:-60m}

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/.bench
interop=$root/internal/interop
mkdir -p "$out"
flags=(-run '^$' -bench "$BENCH" -benchmem -count "$COUNT" -benchtime "$BENCHTIME" -timeout "$TIMEOUT")

# --- 1. root module ---------------------------------------------------------
pkgs=$(cd "$root" && grep -rl --include='*_test.go' -e '^func Benchmark' . 2>/dev/null |
	grep -v -e '^\./internal/interop/' -e '^\./\.bench/' -e '/testdata/' |
	xargs -r -n1 dirname | sort -u)
: >"$out/root.txt"
failed="" # a failing benchmark is reported at the end; the tables still print
if [ -n "$pkgs" ]; then
	echo "== root module benchmarks:" $pkgs >&2
	# shellcheck disable=SC2086
	(cd "$root" && $GO test "${flags[@]}" $pkgs) | tee "$out/root.txt" >&2 || failed="$failed root-module"
fi

# --- 2. internal/interop with the official codec shim -------------------------
shim=$interop/testdata/officialshim
setup_shim() {
	local dir
	dir=$(cd "$interop" && $GO list -m -f '{{.Dir}}' github.com/apache/rocketmq-client-go/v2) || return 1
	[ -n "$dir" ] || return 1
	rm -rf "$out/official"
	cp -R "$dir" "$out/official"
	chmod -R u+w "$out/official"
	cp "$shim/internal/remote/zz_runnelshim.go" "$out/official/internal/remote/"
	mkdir -p "$out/official/runnelshim"
	cp "$shim/runnelshim/shim.go" "$out/official/runnelshim/"
	cp "$interop/go.mod" "$out/interop.mod"
	cp "$interop/go.sum" "$out/interop.sum"
	(cd "$interop" && $GO mod edit -modfile="$out/interop.mod" \
		-replace "github.com/apache/rocketmq-client-go/v2=$out/official" \
		-replace "github.com/runnel-dev/runnel=$root")
	printf '{"Replace":{"%s":"%s"}}\n' "$interop/official_shim_test.go" "$shim/official_shim_test.go" >"$out/overlay.json"
	# The shim's own cross-check must pass before its figures mean anything.
	(cd "$interop" && $GO test -modfile="$out/interop.mod" -overlay="$out/overlay.json" -tags runnelshim \
		-count=1 -run '^TestShim' .) >&2
}
shimflags=()
if setup_shim; then
	shimflags=(-modfile="$out/interop.mod" -overlay="$out/overlay.json" -tags runnelshim)
else
	echo "WARNING: the official codec shim could not be set up; the impl=official frame rows are skipped" >&2
fi
echo "== internal/interop benchmarks" >&2
(cd "$interop" && $GO test "${shimflags[@]}" "${flags[@]}" .) | tee "$out/interop.txt" >&2 || failed="$failed internal/interop"

# --- 3. tables ----------------------------------------------------------------
cat "$out/root.txt" "$out/interop.txt" >"$out/all.txt"
benchstat() { (cd "$interop" && $GO tool benchstat "$@"); }
paired='/impl:(runnel OR official)'
peer='.name:JavaPeer' # BenchmarkJavaPeer: runnel next to Apache RocketMQ's Java broker and clients
echo
echo "### runnel (base) vs official rocketmq-client-go, same run: the official column's delta is relative to runnel"
echo
benchstat -col /impl@'(runnel official)' -filter "$paired -$peer" "$out/interop.txt"
if grep -q '^BenchmarkJavaPeer/' "$out/interop.txt"; then
	# Their own metrics only: ns/op, MB/s, B/op and allocs/op are this Go
	# process's, which for impl=java (a JVM) and the brokers (child
	# processes) say nothing.
	sed -E -e '/^(goos|goarch|pkg|cpu):|^BenchmarkJavaPeer\//!d' \
		-e 's#\t *[0-9.e+-]+ (ns/op|MB/s|B/op|allocs/op)##g' "$out/interop.txt" >"$out/javapeer.txt"
	echo
	echo "### runnel's broker (base) vs Apache RocketMQ's Java broker 5.3.3, same client, same run (impl=java: the official Java client; impl=official: rocketmq-client-go)"
	echo
	benchstat -col /broker@'(runnel java)' "$out/javapeer.txt"
	echo
	echo "### runnel's client (base) vs the official Java client and rocketmq-client-go, on each broker, same run"
	echo
	benchstat -col /impl@'(runnel java official)' -filter "-/op:rss" "$out/javapeer.txt"
fi
ijoin='.name:IntervalJoin' # pipeline's BenchmarkIntervalJoin: the interval join next to a keyed count
if grep -q '^BenchmarkIntervalJoin/' "$out/root.txt"; then
	echo
	echo "### IntervalJoin vs keyed count (base), same input volume, same run (issue 26's target: >= 50 % of keyed count's records/s)"
	echo
	benchstat -col /kind@'(keyed-count interval-join)' -filter "$ijoin" "$out/root.txt"
fi
# pipeline's parallel stages: Rebalance next to the same job without it,
# async I/O next to its bound (capacity / latency; the %bound column).
stages='.name:(RebalanceCPU OR AsyncIO)'
if grep -q -e '^BenchmarkRebalanceCPU/' -e '^BenchmarkAsyncIO/' "$out/root.txt"; then
	echo
	echo "### Rebalance() of a CPU-bound map after a 1-queue source (base: the same job without Rebalance; bare: the same work on GOMAXPROCS goroutines without a job, what the machine allows), same run"
	echo
	benchstat -col /job@'(chained rebalance bare)' -filter '.name:RebalanceCPU' "$out/root.txt"
	echo
	echo "### async I/O, capacity 100, service latency 5 ms: req/s next to the bound of 20,000 (%bound), same run"
	echo
	benchstat -col /service -filter '.name:AsyncIO' "$out/root.txt"
fi
echo
echo "### SYNC_MASTER pair (base: a single broker, both sync flush), same run: BenchmarkBrokerHASend; target: the pair's msgs/s at least 70 % of the single broker's"
echo
ha='/mode:(single OR sync-pair)'
benchstat -col /mode@'(single sync-pair)' -filter "$ha" "$out/root.txt"
echo
echo "### other benchmarks (BenchmarkBrokerHALag: replication lag at half the pair's max rate; target: lag-p99-ms at most 50)"
echo
benchstat -filter "-($paired OR $peer OR $ha OR $ijoin OR $stages)" "runnel=$out/all.txt"
if [ -n "$failed" ]; then
	echo >&2
	echo "FAILED benchmarks in:$failed (see the go test output above and .bench/*.txt)" >&2
	exit 1
fi
