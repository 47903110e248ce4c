package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	goruntime "runtime"
	"sync/atomic"
	"time"

	"github.com/go-playground/validator/v10"

	"github.com/runnel-dev/runnel/checkpoint"
	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/state"
)

var (
	// ErrInvalidGraph is returned by Run (wrapped, with every problem found)
	// when the job graph is invalid: duplicate or empty UIDs, bad options,
	// keys without a codec.
	ErrInvalidGraph = errors.New("pipeline: invalid job graph")
	// ErrPanic wraps a panic recovered from user code.
	ErrPanic = errors.New("pipeline: panic in user function")
	// ErrRunTwice is returned when Run is called a second time.
	ErrRunTwice = errors.New("pipeline: job already run")
	// ErrTimerOutOfRange is returned by the timer methods of KeyedContext
	// for a time outside int64 Unix nanoseconds (before 1678 or after 2262).
	ErrTimerOutOfRange = errors.New("pipeline: timer time outside the int64 nanosecond range (years 1678-2262)")
)

// Codec is the encoding of one type (keys, state, source records): the
// state package's Codec.
type Codec[T any] = state.Codec[T]

// JSON returns the built-in JSON codec for T (state.JSONCodec's encoding;
// its decode errors name T and match state.ErrDecode).
func JSON[T any]() Codec[T] { return jsonCodec[T]{} } // reasons.go

// JobOption configures a Job.
type JobOption interface{ applyJob(*jobConfig) }

type jobOptionFunc func(*jobConfig)

func (f jobOptionFunc) applyJob(c *jobConfig) { f(c) }

type jobConfig struct {
	dir                string
	interval           time.Duration
	timeout            time.Duration
	minPause           time.Duration
	tolerable          int
	maxParallelism     int
	parallelism        int
	logger             *slog.Logger
	clock              func() time.Time
	statusAddr         string
	faults             failpoint.Pipeline
	onStatusAddr       func(string)
	validatorInstance  *validator.Validate
	discoveryInterval  time.Duration
	defaultSourcePol   Policy
	defaultOperatorPol Policy
	obs                jobObs // hooks.go
	stateBuffer        int64
	stateCache         int64           // StateReadCache; 0: the default, < 0: none
	startup            *time.Duration  // StartupTimeout (startup.go); nil: the default
	sp                 savepointConfig // savepoint.go
	// RunWorker (worker.go)
	ranges        int
	workerGroup   string
	snapshotEvery int
	standbys      int
	scaleFaults   failpoint.Scaleout
}

// CheckpointDir sets the job's checkpoint directory (one Pebble store).
// Without it the job checkpoints into a temporary directory removed when Run
// returns: nothing survives a restart.
func CheckpointDir(dir string) JobOption { return jobOptionFunc(func(c *jobConfig) { c.dir = dir }) }

// CheckpointInterval sets the time between periodic checkpoints (0, the
// default, disables them; bounded jobs still take a final checkpoint and
// stopped jobs a stop checkpoint).
func CheckpointInterval(d time.Duration) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.interval = d })
}

// CheckpointTimeout aborts a checkpoint that takes longer (default 1 min).
func CheckpointTimeout(d time.Duration) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.timeout = d })
}

// MinPauseBetweenCheckpoints sets the minimum pause between the end of one
// checkpoint and the start of the next.
func MinPauseBetweenCheckpoints(d time.Duration) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.minPause = d })
}

// TolerableCheckpointFailures sets how many consecutive checkpoint failures
// the job survives (default 0: the first failure fails the job).
func TolerableCheckpointFailures(n int) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.tolerable = n })
}

// MaxParallelism sets the number of key groups (default 128). It is part of
// the checkpoint fingerprint: changing it makes old checkpoints unusable.
func MaxParallelism(n int) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.maxParallelism = n })
}

// StateWriteBuffer bounds (bytes, approximate) the state changes a keyed
// subtask keeps in memory between checkpoints: past it the subtask asks for
// a checkpoint ahead of the interval, which writes them to the store (after
// MinPauseBetweenCheckpoints). Default state.DefaultWriteBufferLimit (64
// MiB); 0 or less keeps the default.
func StateWriteBuffer(bytes int64) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.stateBuffer = bytes })
}

// StateReadCache sets the size (bytes, approximate) of each keyed subtask's
// cache of committed state values (state.WithReadCacheSize): it fills up to
// that size, is emptied and refills. Default state.DefaultReadCacheSize
// (32 MiB); 0 keeps the default, a negative size disables the cache. A job
// whose keys churn (windows: every window's state is new keys) fills it
// with entries it rarely reads again, so its heap grows by up to this much
// per subtask before the cache first empties.
func StateReadCache(bytes int64) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.stateCache = bytes })
}

// DefaultParallelism sets the number of subtasks of keyed operators that do
// not set Parallelism (default GOMAXPROCS).
func DefaultParallelism(n int) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.parallelism = n })
}

// Logger sets the job's logger (nil discards).
func Logger(l *slog.Logger) JobOption { return jobOptionFunc(func(c *jobConfig) { c.logger = l }) }

// Clock sets the processing-time clock (default time.Now). Processing-time
// timers are checked against it at least every 50 ms.
func Clock(now func() time.Time) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.clock = now })
}

// StatusAddress serves the job's status over HTTP on addr (port 0 picks a
// free port; onListen, when not nil, receives the actual address): the
// status page at http://addr/ui/ (also / in a browser) with the job graph,
// lag, watermarks, throughput, checkpoints and recent dead letters, and the
// same data as JSON at /status and /status/history (see package runtime).
func StatusAddress(addr string, onListen func(string)) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.statusAddr, c.onStatusAddr = addr, onListen })
}

// Validator replaces the go-playground validator used at the source edge
// (to register custom validations).
func Validator(v *validator.Validate) JobOption {
	return jobOptionFunc(func(c *jobConfig) { c.validatorInstance = v })
}

// Job is a stream job under construction, then running. Building (the
// functions that take a Job or Stream) is not safe for concurrent use; Run
// may be called once. Name and Status are safe to call from any goroutine,
// also while Run runs.
type Job struct {
	name   string
	cfg    jobConfig
	nodes  []*node
	uids   map[string]*node
	dlqs   map[string]*node
	errs   []error
	ran    bool
	engine atomic.Pointer[runtime.Engine] // set by Run, read by Status
	// scope restricts the job to one scale-out task (set by RunWorker).
	scope *taskScope
}

// New returns an empty job named name.
func New(name string, opts ...JobOption) *Job {
	j := &Job{name: name, uids: make(map[string]*node), dlqs: make(map[string]*node)}
	j.cfg.maxParallelism = state.DefaultMaxParallelism
	j.cfg.parallelism = goruntime.GOMAXPROCS(0)
	j.cfg.defaultSourcePol = Fail()
	j.cfg.defaultOperatorPol = Fail()
	j.cfg.discoveryInterval = DefaultDiscoveryInterval
	for _, o := range opts {
		o.applyJob(&j.cfg)
	}
	if j.cfg.clock == nil {
		j.cfg.clock = time.Now
	}
	if j.cfg.logger == nil {
		j.cfg.logger = slog.New(slog.DiscardHandler)
	}
	if j.cfg.validatorInstance == nil {
		j.cfg.validatorInstance = validator.New(validator.WithRequiredStructEnabled())
	}
	if j.cfg.maxParallelism < 1 || j.cfg.maxParallelism > state.MaxMaxParallelism {
		j.errorf("max parallelism %d outside [1, %d]", j.cfg.maxParallelism, state.MaxMaxParallelism)
	}
	if j.cfg.parallelism < 1 {
		j.errorf("default parallelism %d < 1", j.cfg.parallelism)
	}
	if j.cfg.discoveryInterval < 0 {
		j.errorf("split discovery interval %v < 0", j.cfg.discoveryInterval)
	}
	return j
}

// Name returns the job's name.
func (j *Job) Name() string { return j.name }

func (j *Job) errorf(format string, args ...any) {
	j.errs = append(j.errs, fmt.Errorf(format, args...))
}

// Status returns the running job's status (zero before Run).
// It is safe for concurrent use with Run.
func (j *Job) Status() runtime.Status {
	eng := j.engine.Load()
	if eng == nil {
		return runtime.Status{Job: j.name}
	}
	return eng.Status()
}

// node kinds.
const (
	kindSource    = "source"
	kindMap       = "map"
	kindFilter    = "filter"
	kindFlatMap   = "flatmap"
	kindUnion     = "union"
	kindSide      = "side-output"
	kindProcess   = "keyed-process"
	kindReduce    = "reduce"
	kindAggregate = "aggregate"
	kindSink      = "sink"
)

// node is one operator of the graph. Its typed behaviour lives in closures
// set by the generic constructors, so the graph itself is untyped.
type node struct {
	job    *Job
	id     int
	uid    string
	kind   string
	codecs string
	inputs []*node
	outs   []*node
	sides  []*node // side-output nodes fed by this (keyed) node
	policy Policy
	retry  retryPolicy
	stats  *runtime.OperatorStats

	// exchange nodes (keyed, sink) start their own tasks; chained nodes run
	// inside their producers' tasks.
	exchange    bool
	parallelism int
	senders     int // tasks feeding this exchange node

	// taskCount returns how many tasks the node runs (sources: splits;
	// keyed: parallelism; sinks: 1); nil for chained nodes.
	taskCount func(ctx context.Context, r *jobRun) (int, error)
	// startTask builds one task's chain and registers it on the engine.
	startTask func(r *jobRun, t *taskInfo) error
	// buildInput returns the node's input as an emitFn[In] (chained nodes)
	// or its exchange port for the builder's task (exchange nodes).
	buildInput func(b *chainBuilder) (any, error)
	// setup creates the node's inboxes once senders are counted.
	setup func(r *jobRun) error
	// restore runs before the tasks start (sink recovery).
	restore func(ctx context.Context, r *jobRun) error
	// discover (sources whose splits grow) adds a task per new split
	// (discovery.go); addSender (exchange nodes) makes room in the inboxes
	// for one more sender, whose index is senders-1.
	discover  func(ctx context.Context, r *jobRun) error
	addSender func()

	// Scale-out (scope.go): a keyed node declared PrePartitioned runs in
	// its input's stage; buildRemote returns a keyed node's input when the
	// node heads another stage (a port to its repartition topic);
	// startRepart starts the task that feeds a keyed stage head from its
	// repartition topic.
	prePartitioned bool
	buildRemote    func(b *chainBuilder) (any, error)
	startRepart    func(r *jobRun, t *taskInfo) error
	// src is a source node's source (RunWorker asks it for its topic);
	// sink a sink node's sink (its transactions' check-back information).
	src  any
	sink any
	// binder is the node's source or sink when it implements
	// jobinfo.Binder (bind.go).
	binder jobinfo.Binder
	// broadcast marks an operator with a broadcast input (broadcast.go):
	// RunWorker refuses it.
	broadcast bool
}

func (j *Job) addNode(uid, kind string, inputs ...*node) *node {
	n := &node{job: j, id: len(j.nodes), uid: uid, kind: kind, inputs: inputs, policy: j.cfg.defaultOperatorPol}
	if uid == "" {
		j.errorf("%s operator #%d has an empty UID", kind, n.id)
	} else if _, dup := j.uids[uid]; dup {
		j.errorf("duplicate UID %q", uid)
	} else {
		j.uids[uid] = n
	}
	for _, in := range inputs {
		if in.job != j {
			j.errorf("operator %q mixes streams of different jobs", uid)
		}
		in.outs = append(in.outs, n)
	}
	j.nodes = append(j.nodes, n)
	return n
}

// Run executes the job and blocks until it ends. It returns nil when a
// bounded job has processed all its input and taken its final checkpoint,
// or when ctx was cancelled and the job stopped gracefully with a final
// (stop) checkpoint; it returns an error on an invalid graph, a task failure
// (a Fail policy, a sink error), or checkpoint failures beyond tolerance. A
// job that failed resumes from its latest completed checkpoint when run
// again in a new process (or with a new Job) on the same directory.
func (j *Job) Run(ctx context.Context) error {
	if j.ran {
		return ErrRunTwice
	}
	j.ran = true
	if err := j.validate(); err != nil {
		return err
	}
	if err := j.bind(); err != nil {
		return err
	}
	eng, err := runtime.New(runtime.Config{
		Name:              j.name,
		Dir:               j.cfg.dir,
		Interval:          j.cfg.interval,
		Timeout:           j.cfg.timeout,
		MinPause:          j.cfg.minPause,
		TolerableFailures: j.cfg.tolerable,
		Fingerprint:       j.fingerprint(),
		Logger:            j.cfg.logger,
		Clock:             j.cfg.clock,
		StatusAddr:        j.cfg.statusAddr,
		Hooks:             j.cfg.obs.hooks,
		MetricsAddr:       j.cfg.obs.metricsAddr,
		DiscoveryInterval: j.cfg.discoveryInterval,
		Commit:            j.commitHook(),
		KeepCheckpoints:   j.cfg.sp.keep,
		RetainInterval:    j.cfg.sp.every,
		RestoreFrom:       j.cfg.sp.restore,
	})
	if err != nil {
		return err
	}
	j.engine.Store(eng)
	r := &jobRun{job: j, engine: eng, senderIdx: make(map[[2]int]int), hooks: newRunHooks(j.name, j.cfg.obs.hooks), scope: j.scope}
	if err := r.plan(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			// Asked to stop while starting (e.g. SIGTERM during a source's
			// route lookup): nothing was read, the last checkpoint stands,
			// so this is a clean stop, not a failure.
			return eng.Close()
		}
		return errors.Join(err, eng.Close())
	}
	r.publishStatus() // statusgraph.go: the graph and offset descriptions
	if j.cfg.onStatusAddr != nil {
		j.cfg.onStatusAddr(eng.StatusAddr())
	}
	if j.cfg.obs.onMetricsAddr != nil {
		j.cfg.obs.onMetricsAddr(eng.MetricsAddr())
	}
	return eng.Run(ctx)
}

// commitHook is the scale-out task's checkpoint publisher (nil otherwise).
func (j *Job) commitHook() runtime.CommitHook {
	if j.scope == nil || j.scope.commit == nil {
		return nil
	}
	return j.scope.commit
}

func (j *Job) validate() error {
	errs := append([]error(nil), j.errs...)
	for _, n := range j.nodes {
		if n.exchange && n.kind != kindSink && (n.parallelism < 1 || n.parallelism > j.cfg.maxParallelism) {
			errs = append(errs, fmt.Errorf("operator %q: parallelism %d outside [1, max parallelism %d]", n.uid, n.parallelism, j.cfg.maxParallelism))
		}
	}
	if len(j.nodes) == 0 {
		errs = append(errs, errors.New("the job has no operators"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidGraph, errors.Join(errs...))
	}
	return nil
}

// fingerprint lists the keyed operators: their UIDs, kinds and codecs are
// what a checkpoint's state depends on.
func (j *Job) fingerprint() checkpoint.Fingerprint {
	fp := checkpoint.Fingerprint{MaxParallelism: j.cfg.maxParallelism}
	for _, n := range j.nodes {
		switch n.kind {
		case kindProcess, kindReduce, kindAggregate:
			fp.Operators = append(fp.Operators, checkpoint.OperatorInfo{UID: n.uid, Kind: n.kind, Codecs: n.codecs})
		}
	}
	fp.Operators = append(fp.Operators, j.stateOperators()...) // rebalance.go
	return fp
}

// validatable reports whether T is a struct or a pointer to one (what
// validator's Struct accepts).
func validatable[T any]() bool {
	t := reflect.TypeFor[T]()
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct
}

// Policy says what happens to a record that fails: decoding or validation
// at a source, or a user function after its retries.
type Policy struct {
	kind policyKind
	uid  string
	sink sink.Sink[sink.DeadLetter]
}

type policyKind uint8

const (
	policyFail policyKind = iota
	policySkip
	policyDeadLetter
)

// Fail fails the job on a bad record (the default).
func Fail() Policy { return Policy{kind: policyFail} }

// Skip drops bad records, counting them in the operator's rejected-records
// metric.
func Skip() Policy { return Policy{kind: policySkip} }

// DeadLetter sends bad records to s as sink.DeadLetter records. uid is the
// dead-letter sink's operator UID; policies naming the same uid share one
// sink (give them the same s).
func DeadLetter(uid string, s sink.Sink[sink.DeadLetter]) Policy {
	return Policy{kind: policyDeadLetter, uid: uid, sink: s}
}

// dlqNode returns (creating) the sink node of a dead-letter policy.
func (j *Job) dlqNode(p Policy) *node {
	if p.kind != policyDeadLetter {
		return nil
	}
	if n, ok := j.dlqs[p.uid]; ok {
		return n
	}
	if p.sink == nil {
		j.errorf("dead-letter policy %q has a nil sink", p.uid)
	}
	n := newSinkNode(j, p.uid, p.sink)
	j.dlqs[p.uid] = n
	return n
}
