package rocketmq

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/runnel-dev/runnel/transport/client"
)

// Defaults of the source's options.
const (
	// DefaultMaxBufferedMsgs and DefaultMaxBufferedBytes bound the messages
	// pulled ahead and not yet returned by Poll, per split (RocketMQ's
	// ProcessQueue thresholds).
	DefaultMaxBufferedMsgs  = 1000
	DefaultMaxBufferedBytes = 100 << 20
	// DefaultPollTimeout is how long the broker may hold a pull that finds
	// no new message (long polling).
	DefaultPollTimeout = 500 * time.Millisecond
	// DefaultPullBatchSize is the messages asked for by one pull.
	DefaultPullBatchSize = 32
	// DefaultPullRetries is the number of consecutive failed pulls after
	// which Poll fails.
	DefaultPullRetries = 10
	// DefaultReportTimeout bounds the offset report to the broker after a
	// checkpoint.
	DefaultReportTimeout = 2 * time.Second
)

// Option configures a Source.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	group         string
	groupSet      bool // WithGroup was given: Bind keeps the group
	start         StartPosition
	stop          StopPosition
	tagExpr       string
	maxMsgs       int
	maxBytes      int64
	pollTimeout   time.Duration
	batch         int
	retries       int
	storeTime     bool
	report        bool
	reportTimeout time.Duration
	log           *slog.Logger
	locks         bool
	lockWait      time.Duration
	lockRenew     time.Duration
	lockValidity  time.Duration
}

func (c *config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	switch {
	case c.maxMsgs < 1:
		return bad("max buffered messages %d < 1", c.maxMsgs)
	case c.maxBytes < 1:
		return bad("max buffered bytes %d < 1", c.maxBytes)
	case c.pollTimeout < 0 || c.pollTimeout > 30*time.Second:
		return bad("poll timeout %v outside [0, 30s]", c.pollTimeout)
	case c.batch < 1 || c.batch > 1<<16:
		return bad("pull batch size %d outside [1, 65536]", c.batch)
	case c.retries < 0:
		return bad("pull retries %d < 0", c.retries)
	case c.reportTimeout <= 0:
		return bad("report timeout %v <= 0", c.reportTimeout)
	case c.lockWait < 0:
		return bad("lock wait %v < 0", c.lockWait)
	case c.lockRenew <= 0 || c.lockValidity <= c.lockRenew:
		return bad("lock validity %v must exceed the renew interval %v", c.lockValidity, c.lockRenew)
	}
	if err := c.start.validate(); err != nil {
		return err
	}
	return c.stop.validate()
}

// WithGroup sets the consumer group the source pulls as, reports its
// checkpointed offsets under and takes queue locks in. The default is the
// job's: GroupName of the name of the pipeline job the source is bound to
// (Bind), or "runnel_" + topic for a source used outside a job. Brokers
// create unknown groups on first use unless configured not to.
func WithGroup(group string) Option {
	return optionFunc(func(c *config) { c.group, c.groupSet = group, true })
}

// WithStart sets where a split without a checkpointed offset starts
// (default Earliest()).
func WithStart(p StartPosition) Option { return optionFunc(func(c *config) { c.start = p }) }

// WithStop makes the source bounded (default: unbounded).
func WithStop(p StopPosition) Option { return optionFunc(func(c *config) { c.stop = p }) }

// WithTagFilter reads only messages whose tag matches a TAG expression such
// as "a || b" ("" or "*" = all).
func WithTagFilter(expr string) Option { return optionFunc(func(c *config) { c.tagExpr = expr }) }

// WithFlowControl bounds, per split, the messages and bytes pulled ahead of
// Poll (defaults DefaultMaxBufferedMsgs, DefaultMaxBufferedBytes). The fetcher
// stops pulling once either is reached, so one pull may overshoot them by at
// most one pull batch.
func WithFlowControl(maxMsgs int, maxBytes int64) Option {
	return optionFunc(func(c *config) { c.maxMsgs, c.maxBytes = maxMsgs, maxBytes })
}

// WithPollTimeout sets the long-polling suspend time of each pull (default
// DefaultPollTimeout; 0 polls without suspending).
func WithPollTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.pollTimeout = d })
}

// WithPullBatchSize sets the messages asked for by one pull (default 32;
// brokers cap it, 32 by default).
func WithPullBatchSize(n int) Option { return optionFunc(func(c *config) { c.batch = n }) }

// WithPullRetries sets how many consecutive failed pulls of a split are
// retried (with backoff) before Poll fails (default DefaultPullRetries).
func WithPullRetries(n int) Option { return optionFunc(func(c *config) { c.retries = n }) }

// WithStoreTime makes the broker's store timestamp the records' event time
// (default: the born timestamp).
func WithStoreTime() Option { return optionFunc(func(c *config) { c.storeTime = true }) }

// WithOffsetReporting turns the report of checkpointed offsets to the broker
// (CommitOffset under the group after each completed checkpoint) on (the
// default) or off.
func WithOffsetReporting(on bool) Option { return optionFunc(func(c *config) { c.report = on }) }

// WithQueueLocking makes the source take the broker lock of every queue of
// the topic under its group before reading, renew it, and fail the split
// (ErrQueueLockLost) if it is lost: one process owns the job's queues (see
// the package documentation). Default off. Call Close after the job to
// release the locks. Jobs exclude each other when they lock in the same
// group: the default group, the job's name, keeps different jobs apart.
func WithQueueLocking(on bool) Option { return optionFunc(func(c *config) { c.locks = on }) }

// WithLockWait bounds how long Splits and Open wait for queue locks held by
// another client before failing with ErrQueueLocked (default 0: wait until
// the context is done).
func WithLockWait(d time.Duration) Option { return optionFunc(func(c *config) { c.lockWait = d }) }

// WithLockRenewInterval sets how often the queue locks are renewed
// (default client.DefaultLockRenewInterval); it must stay below the lock
// validity (WithLockValidity).
func WithLockRenewInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lockRenew = d })
}

// WithLockValidity sets how long this client trusts a queue lock after the
// request that took or renewed it (default client.DefaultLockValidity); it
// must exceed the renew interval and stay below the broker's lock expiry
// (60 s by default).
func WithLockValidity(d time.Duration) Option {
	return optionFunc(func(c *config) { c.lockValidity = d })
}

// WithLogger sets the source's logger (nil discards).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.log = l }) }

type startKind int

const (
	startEarliest startKind = iota
	startLatest
	startTimestamp
	startGroup
	startOffsets
)

// StartPosition says where a split without a checkpointed offset starts. The
// zero value is Earliest.
type StartPosition struct {
	kind     startKind
	t        time.Time
	offsets  map[string]int64
	fallback *StartPosition
}

// Earliest starts at the queue's min offset (the oldest message kept).
func Earliest() StartPosition { return StartPosition{kind: startEarliest} }

// Latest starts at the queue's max offset when the split is opened: only
// messages stored after that are read.
func Latest() StartPosition { return StartPosition{kind: startLatest} }

// AtTimestamp starts at the first message stored at or after t.
func AtTimestamp(t time.Time) StartPosition { return StartPosition{kind: startTimestamp, t: t} }

// GroupOffset starts at the offset the source's group committed on the
// broker, or at fallback when it has none.
func GroupOffset(fallback StartPosition) StartPosition {
	return StartPosition{kind: startGroup, fallback: &fallback}
}

// Offsets starts each split at offsets[splitID] ("brokerName/queueId"), and
// splits missing from the map at fallback. The map is copied.
func Offsets(offsets map[string]int64, fallback StartPosition) StartPosition {
	m := make(map[string]int64, len(offsets))
	for k, v := range offsets {
		m[k] = v
	}
	return StartPosition{kind: startOffsets, offsets: m, fallback: &fallback}
}

func (p StartPosition) validate() error {
	for _, v := range p.offsets {
		if v < 0 {
			return fmt.Errorf("%w: negative start offset %d", ErrInvalidOption, v)
		}
	}
	if p.fallback != nil {
		return p.fallback.validate()
	}
	return nil
}

type stopKind int

const (
	stopNone stopKind = iota
	stopOffsets
	stopLatest
	stopTimestamp
)

// StopPosition makes a source bounded. The zero value is unbounded.
type StopPosition struct {
	kind    stopKind
	offsets map[string]int64
	t       time.Time
	grace   time.Duration
}

// StopAtOffsets stops each split before offsets[splitID] (exclusive). Splits
// missing from the map end at once. The map is copied.
func StopAtOffsets(offsets map[string]int64) StopPosition {
	m := make(map[string]int64, len(offsets))
	for k, v := range offsets {
		m[k] = v
	}
	return StopPosition{kind: stopOffsets, offsets: m}
}

// StopAtLatest stops each split at the queue's max offset seen when the
// split is first opened; that offset is kept in the split's checkpointed
// offset, so a restarted job stops at the same place.
func StopAtLatest() StopPosition { return StopPosition{kind: stopLatest} }

// StopAtTimestamp stops each split at its first message whose event time
// (born or store timestamp, see WithStoreTime) is at or after t, or, when a
// split has no new message, once the clock is grace past t (messages may
// still be in flight to the broker at t).
func StopAtTimestamp(t time.Time, grace time.Duration) StopPosition {
	return StopPosition{kind: stopTimestamp, t: t, grace: grace}
}

func (p StopPosition) validate() error {
	for _, v := range p.offsets {
		if v < 0 {
			return fmt.Errorf("%w: negative stop offset %d", ErrInvalidOption, v)
		}
	}
	if p.grace < 0 {
		return fmt.Errorf("%w: negative stop grace %v", ErrInvalidOption, p.grace)
	}
	return nil
}

// GroupName returns the consumer group of job's RocketMQ sources when they
// are given none (WithGroup): job's name with the characters RocketMQ does
// not allow in group names replaced by '_', cut to client.MaxGroupLength.
// A job named "etl" reads as group "etl".
func GroupName(job string) string {
	g := []byte(job)
	for i, b := range g {
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9', b == '_', b == '-':
		default:
			g[i] = '_'
		}
	}
	if len(g) > client.MaxGroupLength {
		g = g[:client.MaxGroupLength]
	}
	return string(g)
}
