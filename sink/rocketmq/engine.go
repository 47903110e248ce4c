package rocketmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/internal/failpoint"
	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/transport/client"
)

// The exactly-once sink's transaction engine, by concern:
//
//	engine.go     txEngine: identity (Bind), configuration, the fatal error, Close
//	epoch.go      the open epoch: its records (slots), lanes, the discard-window refresh
//	halfsend.go   half sends and their settlement (acknowledged, retried, failed for good)
//	commit.go     pre-commit, the commits in checkpoint order (committer goroutine), abort
//	lanes.go      the lane committer: END_TRANSACTIONs in order per lane, lanes in parallel
//	checkback.go  check-back answers: the decision and the local view it is made from
//	restore.go    Recover
//	txndesc.go    the transaction description's encoding
//	txoptions.go  TxOption and the protocol's phases
//	failpoints.go WithTxFaults, WithPhaseHook (failpoints build tag)
//
// ExactlyOnce[T] (exactly.go) maps records to messages and forwards every
// call to its engine.

// txEngine is the transaction engine of the exactly-once sink: epochs of
// half messages, their settlement, pre-commit, the commits and check-back
// answers. It handles messages, not records, so it is the same for every
// ExactlyOnce[T].
//
// Its methods without a goroutine named are for the sink's task goroutine
// (bind for the pipeline, before them).
type txEngine struct {
	c   *client.Client
	cfg txConfig
	log *slog.Logger
	run string

	// Set once, before the first use (newTxEngine with WithTxGroup, or
	// bind); nil p: no group yet (ErrNoTxGroup).
	group string
	p     *client.Producer
	lanes laneCommitter

	sem     chan struct{}  // one token per half send in flight (or being retried)
	workers sync.WaitGroup // half sends being retried (resend)

	// onHalf is e.halfSent, bound once (epochs hand it to their slots).
	onHalf func(sl *slot, h client.TxHandle, err error)

	// Task-goroutine state.
	epoch    uint64      // tag of the open epoch
	open     *epochTxn   // records written since the last PreCommit
	sealed   []*epochTxn // pre-committed, not yet committed (oldest first)
	rr       uint32      // lane of records without a key
	closed   bool
	done     map[string]bool // transactions (run/epoch) committed in this process
	inflight *commitJob      // the commit running on the committer goroutine

	fatal atomic.Pointer[error]

	// floors observes the output queues (floors.go).
	floors *floorTracker

	// view is what this process knows of its half messages; decider
	// answers check-backs (from view: see checkback.go).
	view    *localView
	decider txDecider
	// scale is the scale-out task the sink belongs to (nil: a job in one
	// process); ownerTag its owner epoch in decimal (PropOwner).
	scale    *jobinfo.Scaleout
	ownerTag string
}

func newTxEngine(c *client.Client, opts []TxOption) (*txEngine, error) {
	cfg := defaultTxConfig()
	for _, o := range opts {
		o.applyTx(&cfg)
	}
	switch {
	case cfg.groupSet && cfg.group == "":
		return nil, fmt.Errorf("%w: empty producer group", ErrInvalidOption)
	case cfg.lanes < 1 || cfg.lanes > 4096:
		return nil, fmt.Errorf("%w: commit lanes %d outside [1, 4096]", ErrInvalidOption, cfg.lanes)
	case cfg.maxInFlight < 1 || cfg.maxInFlight > 1<<16:
		return nil, fmt.Errorf("%w: max in flight %d outside [1, 65536]", ErrInvalidOption, cfg.maxInFlight)
	case cfg.attempts < 1:
		return nil, fmt.Errorf("%w: attempts %d < 1", ErrInvalidOption, cfg.attempts)
	case cfg.sendTimeout <= 0:
		return nil, fmt.Errorf("%w: send timeout %v <= 0", ErrInvalidOption, cfg.sendTimeout)
	case cfg.discardWindow <= 0:
		return nil, fmt.Errorf("%w: discard window %v <= 0", ErrInvalidOption, cfg.discardWindow)
	case cfg.maxEpoch < 1:
		return nil, fmt.Errorf("%w: max epoch records %d < 1", ErrInvalidOption, cfg.maxEpoch)
	case cfg.restoreSettle < 0:
		return nil, fmt.Errorf("%w: restore settle %v < 0", ErrInvalidOption, cfg.restoreSettle)
	}
	var rb [8]byte
	_, _ = rand.Read(rb[:]) // never fails (crypto/rand panics instead)
	e := &txEngine{
		c: c, cfg: cfg, log: cfg.log, run: hex.EncodeToString(rb[:]),
		sem: make(chan struct{}, cfg.maxInFlight), epoch: 1,
		done: make(map[string]bool),
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.view = newLocalView(e.run)
	e.decider = e.view
	e.onHalf = e.halfSent
	if cfg.groupSet {
		if err := e.startProducer(cfg.group); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// bind takes the sink's identity from the job (jobinfo.Binder). A sink of
// a scale-out task answers check-backs from the job's commit chains.
func (e *txEngine) bind(info jobinfo.Info) error {
	if sc := info.Scaleout; sc != nil && e.scale == nil {
		if sc.Task == "" || sc.Chains == nil {
			return fmt.Errorf("%w: Bind: scale-out task without a task id or commit chains", ErrInvalidOption)
		}
		e.scale, e.ownerTag = sc, strconv.FormatUint(sc.OwnerEpoch, 10)
		e.decider = &chainDecider{chains: sc.Chains, sink: info.UID, view: e.view, patience: e.cfg.discardWindow / 2}
	}
	if e.cfg.groupSet {
		return nil // WithTxGroup's group wins
	}
	if info.Job == "" || info.UID == "" {
		return fmt.Errorf("%w: Bind needs a job name and an operator UID (job %q, UID %q)", ErrInvalidOption, info.Job, info.UID)
	}
	g := TxGroup(info.Job, info.UID)
	switch {
	case e.p != nil && g == e.group:
		return nil
	case e.p != nil:
		return fmt.Errorf("%w: the sink is bound to producer group %s; Bind to job %q, UID %q would make it %s",
			ErrInvalidOption, e.group, info.Job, info.UID, g)
	case e.closed:
		return ErrClosed
	}
	return e.startProducer(g)
}

// startProducer creates the sink's producer of group (no I/O: the client's
// heartbeats announce it) and the lane committer that ends its half
// messages.
func (e *txEngine) startProducer(group string) error {
	popts := append(append([]client.ProducerOption(nil), e.cfg.producerOpts...),
		client.WithSelector(client.HashBySharding()), client.WithCheckListener(e.checkBack))
	if e.cfg.sendTimeoutSet {
		// Bounds each asynchronous half send (enqueue) without a context
		// per record.
		popts = append(popts, client.WithSendTimeout(e.cfg.sendTimeout))
	}
	// The group first: check-backs (which log it) may come as soon as the
	// producer exists.
	e.group = group
	p, err := client.NewProducer(e.c, group, popts...)
	if err != nil {
		e.group = ""
		return fmt.Errorf("rocketmq sink: %w", err)
	}
	e.p = p
	e.lanes = laneCommitter{end: p, attempts: e.cfg.attempts, retry: e.cfg.retry, log: e.log, group: group}
	if n := e.cfg.faults.LoseEndAnswers; failpoint.Enabled && n > 0 {
		la := &lostAnswers{endSender: p}
		la.n.Store(int64(n))
		e.lanes.end = la
	}
	if e.cfg.sendTimeoutSet {
		e.lanes.timeout = e.cfg.sendTimeout
	}
	e.floors = newFloorTracker(e.c, e.cfg.attempts, e.cfg.retry, e.lanes.timeout)
	return nil
}

// usable returns the error of a call on a closed sink, or on one without a
// producer group.
func (e *txEngine) usable() error {
	switch {
	case e.closed:
		return ErrClosed
	case e.p == nil:
		return ErrNoTxGroup
	}
	return nil
}

func (e *txEngine) hook(p Phase, epoch uint64) {
	if failpoint.Enabled && e.cfg.hook != nil {
		e.cfg.hook(p, epoch)
	}
}

func (e *txEngine) err() error {
	if p := e.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records err as the sink's fatal error (the first one wins) and
// returns the fatal error.
func (e *txEngine) fail(err error) error {
	e.fatal.CompareAndSwap(nil, &err)
	return e.err()
}

// attemptCtx returns the context of one request to the broker: ctx itself
// when timeout is 0 (the client then bounds the request by its own request
// timeout, without a timer per call), else ctx with that timeout.
func attemptCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout == 0 {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, timeout)
}

// noCancel is attemptCtx's cancel function when it adds no deadline.
func noCancel() {}

func txKey(run string, epoch uint64) string { return run + "/" + strconv.FormatUint(epoch, 10) }

// close implements Close.
func (e *txEngine) close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	if e.p == nil {
		return nil // never bound: nothing was sent
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.sendTimeout+closeWait)
	defer cancel()
	err := e.drain(ctx)
	if err == nil {
		e.workers.Wait() // no token held: every resend is returning
	}
	if job := e.inflight; job != nil {
		<-job.done // bounded by the retries of each END_TRANSACTION
		err = errors.Join(err, e.waitCommit(ctx))
	}
	if err == nil {
		err = e.err() // a failure the runtime may not have seen yet (a background commit)
	}
	e.floors.close()
	return errors.Join(err, e.p.Close())
}
