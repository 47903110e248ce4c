# runnel — developer entry points. `make run` and `make test` are the two
# set-up commands of the README; CI (.ci/run) calls `make test`.

GO       ?= go
# invariants: Pebble-style consistency checks; failpoints: the faults and
# phase hooks of the crash tests' control variants (internal/failpoint).
TAGS     ?= invariants,failpoints
# Nested modules (each has its own go.mod); the root module is ".".
MODULES  := . $(patsubst ./%/go.mod,%,$(shell find . -mindepth 2 -name go.mod -not -path './.git/*' -not -path './.bench/*' | sort))
FUZZTIME ?= 10s
BENCHCOUNT ?= 6

.PHONY: run test test-short test-noinv test-failpoints lint fuzz bench mem soak tidy-check generate-check build test-watermill-full test-abuse

## run: the exactly-once ETL demo (examples/etl) end to end on an embedded name
## server + broker it starts itself: sample orders with a progress bar, the job as
## a child process SIGKILLed once mid-way and restarted, then the output and DLQ
## read back and checked; exits 0 only if every order arrived exactly once
## (`runnel demo wordcount` is the word-count demo)
run:
	$(GO) run ./cmd/runnel demo

## build: compile every package of every module
build:
	@for m in $(MODULES); do (cd $$m && echo "== build $$m" && $(GO) build ./... ) || exit 1; done

## test: vet, then every test of every module with -race (root module with the
## invariants and failpoints tags, nested modules with failpoints)
test:
	@for m in $(MODULES); do \
		echo "== vet $$m"; (cd $$m && $(GO) vet -tags $(TAGS) ./...) || exit 1; \
	done
	$(GO) test -race -tags $(TAGS) -timeout 20m ./...
	@for m in $(filter-out .,$(MODULES)); do \
		echo "== test $$m"; (cd $$m && $(GO) test -race -tags failpoints -timeout 15m ./...) || exit 1; \
	done

## test-failpoints: the exactly-once ETL failpoint matrix (build tag failpoints):
## SIGKILL at each protocol boundary, 20 runs each (FAILPOINT_FLAGS=-short: 3)
test-failpoints:
	RUNNEL_FAILPOINT_MATRIX=1 $(GO) test -race -tags invariants,failpoints -timeout 30m -run 'TestE2EETLFailpoints' $(FAILPOINT_FLAGS) -v ./internal/e2e/

## test-watermill-full: watermill's universal Pub/Sub suite at full size against
## the embedded broker (make test runs it with watermill's short counts), and its
## stress variant
test-watermill-full:
	RUNNEL_WATERMILL_FULL=1 $(GO) test -race -timeout 30m -run 'TestPubSub' -v ./transport/watermill/
	$(GO) test -race -tags stress -timeout 30m -run 'TestPubSubStressTest' ./transport/watermill/

## test-abuse: the broker abuse test at the full counts of issue 11 (1,000
## slow and 1,000 idle connections, 100 pull clients that never read, a flood
## of 500 beyond the cap), the healthy client's p99 held to 2x its baseline
## (make test runs it at reduced counts); without -race, as the figures are
## the broker's, not the race detector's; -v prints them
test-abuse:
	RUNNEL_ABUSE_FULL=1 RUNNEL_ABUSE_LATENCY=1 $(GO) test -tags $(TAGS) -count=1 -timeout 10m -run '^TestBrokerAbuse$$' -v ./transport/broker/

## test-short: quick run without -race, skipping long tests
test-short:
	@for m in $(MODULES); do (cd $$m && $(GO) test -short ./...) || exit 1; done

## test-noinv: the production build (no invariants or failpoints tag; the
## crash tests' control variants skip)
test-noinv:
	$(GO) test -timeout 20m ./...

## lint: gofmt, go vet, the project bans in internal/lint, generated code up to date
lint: generate-check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done
	$(GO) test -count=1 ./internal/lint/
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run ./...; else echo "golangci-lint not installed: skipped"; fi

## generate-check: go generate leaves the tree unchanged
generate-check:
	$(GO) generate ./...
	@git diff --exit-code -- . ':(exclude)go.sum' || { echo "generated code is stale: run go generate ./... and commit"; exit 1; }

## fuzz: run every fuzz target of every package for FUZZTIME (default 10s)
fuzz:
	@./scripts/fuzz.sh $(FUZZTIME)

## bench: benchmarks next to their peers (official Go client, ...) as a benchstat table
bench:
	@./scripts/bench.sh $(BENCHCOUNT)

## mem: memory figures (internal/e2e BenchmarkMem*, a few minutes): the broker's
## resident memory and Go heap with 1M messages of 1 KiB stored, with 100
## consumers long-polling and per idle connection; a keyed job's peak resident
## memory with 1M and 10M keys of state (MEMFLAGS=-short: 100k messages, 1M keys)
mem:
	RUNNEL_BENCH_MEM=1 $(GO) test -run '^$$' -bench '^BenchmarkMem' -benchtime 1x -count 1 -timeout 60m $(MEMFLAGS) -v ./internal/e2e/

## soak: examples/etl's job exactly-once and a windowed job on the embedded broker
## for SOAKTIME (default 30m) at SOAKRATE records/s each (default 2000): every
## 10 s throughput, p99 latency, heap and open files, printed as a table at the
## end; fails on an error, a lost or duplicated record, a throughput drop, or growth
SOAKTIME ?= 30m
SOAKRATE ?= 2000
soak:
	RUNNEL_SOAK=$(SOAKTIME) RUNNEL_SOAK_RATE=$(SOAKRATE) $(GO) test -count=1 -timeout 3h -run '^TestSoak$$' -v ./internal/e2e/

## tidy-check: go.mod and go.sum are tidy in every module
tidy-check:
	@for m in $(MODULES); do (cd $$m && echo "== tidy $$m" && $(GO) mod tidy -diff) || exit 1; done
