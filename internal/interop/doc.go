// Package interop cross-checks runnel's wire codecs against the official
// Apache RocketMQ Go client (github.com/apache/rocketmq-client-go/v2) and
// benchmarks them side by side.
//
// It is a nested module so that the official client never enters runnel's
// own go.mod; only its tests and benchmarks have content, and nothing
// imports it.
//
// # Cross-checks
//
// The tests run the official producer and admin clients against a capture
// server on 127.0.0.1 that decodes every frame they send with runnel's
// protocol package and answers with frames runnel encodes, in both header
// encodings. Stored records encoded by runnel are decoded by the official
// primitive.DecodeMessage, and the official batch and properties encoders
// are checked against runnel's.
//
// # Broker interop and durability
//
// The TestBroker* tests run the official producer, push consumers
// (clustering, broadcasting, orderly), lite pull consumer and admin client
// against runnel's name server and broker started in-process on port 0;
// every message is recorded in a ledger and compared field by field with
// what arrived. The official orderly consumer races with itself, so under
// -race that test runs its client in a child built without -race against
// the parent's (race-instrumented) broker. TestDurabilityKill9 builds
// cmd/runnel, SIGKILLs a `runnel broker --flush sync` child under
// concurrent load and checks every acknowledged message after each restart.
//
// # Benchmarks
//
// Paired benchmarks are named Benchmark<What>/<case>/impl=runnel and
// .../impl=official, so that `benchstat -col /impl` shows the two side by
// side. The official frame codec lives in the client's internal/remote
// package, which another module cannot import, and the Go tool refuses
// -overlay for files in the module cache. scripts/bench.sh therefore copies
// the official module under .bench/, adds the shim files of
// testdata/officialshim (a new runnelshim package and one file exporting
// internal/remote's own decoder; no upstream file changes), points a
// throw-away -modfile at the copy, and adds the runnelshim-tagged benchmark
// file with -overlay. Without that set-up the impl=official rows of the
// frame benchmarks are skipped; a plain go test needs none of it.
package interop
