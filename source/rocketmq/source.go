package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/runnel-dev/runnel/jobinfo"
	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

var (
	// ErrInvalidOption is wrapped by New's errors for unusable options.
	ErrInvalidOption = errors.New("rocketmq source: invalid option")
	// ErrInvalidSplit is returned by Open for a split ID that is not
	// "brokerName/queueId".
	ErrInvalidSplit = errors.New("rocketmq source: invalid split")
	// ErrClosed is returned by Poll after Close.
	ErrClosed = errors.New("rocketmq source: closed")
)

// Source reads one topic: one split per readable message queue. It
// implements source.Source[Message], source.Discoverer and jobinfo.Binder;
// Bytes adapts it to source.Source[[]byte].
//
// A Source is safe for concurrent use (each split task opens its own
// reader). A Source made by New does not own its Client: close the Client
// after the job ends. One made by Dial owns the Client it makes; Close
// closes it.
type Source struct {
	// c is the source's client: New's, or the one connect made from dial.
	// It is set before any reader exists (connect runs first in Splits,
	// DiscoverSplits and Open) and never changes afterwards.
	c     *client.Client
	dial  []client.Option // Dial's client options; nil for New
	topic string
	cfg   config
	log   *slog.Logger

	mu struct {
		sync.Mutex
		listed   map[string]bool // splits returned by Splits
		bound    *jobinfo.Info   // set by Bind
		instance string          // the instance name Bind derived (Dial)
		closed   bool            // Close was called (Dial: no new client)
	}
	// lk holds the queue locks (WithQueueLocking; locks.go). Lock order: lk
	// before mu.
	lk struct {
		sync.Mutex
		q      *queueLocks
		closed bool
	}
}

var (
	_ source.Source[Message] = (*Source)(nil)
	_ source.Discoverer      = (*Source)(nil)
	_ jobinfo.Binder         = (*Source)(nil)
)

// New returns a source of topic read through c. It validates the options and
// does no I/O.
func New(c *client.Client, topic string, opts ...Option) (*Source, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOption)
	}
	return newSource(c, nil, topic, opts)
}

// Dial returns a source of topic that reads through a Client of its own,
// made from clientOpts when it is first used (Splits, Open, DiscoverSplits)
// and closed by Close. Bound to a job with a checkpoint directory (see
// Bind), its client's instance name is InstanceName(job, directory) unless
// clientOpts set one (client.WithInstanceName): the same on every run of
// the job on that directory, which is what lets a restarted job take its
// queue locks back at once (WithQueueLocking). It validates the options and
// does no I/O.
func Dial(topic string, clientOpts []client.Option, opts ...Option) (*Source, error) {
	return newSource(nil, append([]client.Option{}, clientOpts...), topic, opts)
}

func newSource(c *client.Client, dial []client.Option, topic string, opts []Option) (*Source, error) {
	if topic == "" {
		return nil, fmt.Errorf("%w: empty topic", ErrInvalidOption)
	}
	cfg := config{
		group:         "runnel_" + topic,
		maxMsgs:       DefaultMaxBufferedMsgs,
		maxBytes:      DefaultMaxBufferedBytes,
		pollTimeout:   DefaultPollTimeout,
		batch:         DefaultPullBatchSize,
		retries:       DefaultPullRetries,
		report:        true,
		reportTimeout: DefaultReportTimeout,
		lockRenew:     client.DefaultLockRenewInterval,
		lockValidity:  client.DefaultLockValidity,
	}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.group == "" {
		return nil, fmt.Errorf("%w: empty group", ErrInvalidOption)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{c: c, dial: dial, topic: topic, cfg: cfg, log: log.With("topic", topic)}
	return s, nil
}

// Topic returns the topic the source reads.
func (s *Source) Topic() string { return s.topic }

// Group returns the consumer group the source pulls as, reports offsets
// under and takes queue locks in: WithGroup's, else, once bound to a job,
// GroupName of the job's name, else "runnel_" + topic.
func (s *Source) Group() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.group
}

// Bind implements jobinfo.Binder; a pipeline job calls it before it uses
// the source. Without WithGroup, the source's consumer group becomes
// GroupName(info.Job) (instead of "runnel_" + topic). A Dial source bound
// with a state directory names its client InstanceName(info.Job,
// info.StateDir) unless its client options name it. Binding again to the
// same job and directory (the source added under another UID) changes
// nothing; binding to another job, or a Dial source after its client was
// made, is an error.
func (s *Source) Bind(info jobinfo.Info) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.mu.bound; b != nil {
		if b.Job != info.Job || b.StateDir != info.StateDir {
			return fmt.Errorf("rocketmq source: %s: already bound to job %q (state %q), not %q (state %q)",
				s.topic, b.Job, b.StateDir, info.Job, info.StateDir)
		}
		return nil
	}
	if s.dial != nil && s.c != nil {
		return fmt.Errorf("rocketmq source: %s: bound after its client was made", s.topic)
	}
	if !s.cfg.groupSet && info.Job != "" {
		s.cfg.group = GroupName(info.Job)
	}
	if s.dial != nil && info.StateDir != "" {
		s.mu.instance = InstanceName(info.Job, info.StateDir)
	}
	s.mu.bound = &info
	s.log.Debug("bound to job", "job", info.Job, "uid", info.UID, "group", s.cfg.group, "instance", s.mu.instance)
	return nil
}

// connect makes a Dial source's client on first use; a New source has
// one. Every entry point calls it before it reads s.c.
func (s *Source) connect() error {
	if s.dial == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.c != nil:
		return nil
	case s.mu.closed:
		return ErrClosed
	}
	opts := s.dial
	if s.mu.instance != "" {
		// First, so that the user's client.WithInstanceName wins.
		opts = append([]client.Option{client.WithInstanceName(s.mu.instance)}, s.dial...)
	}
	c, err := client.New(opts...)
	if err != nil {
		return fmt.Errorf("rocketmq source: client: %w", err)
	}
	s.c = c
	return nil
}

// Splits implements source.Source: the topic's readable queues, sorted by
// broker name then queue id. It asks a name server for the route (bounded by
// ctx).
func (s *Source) Splits(ctx context.Context) ([]source.Split, error) {
	if err := s.connect(); err != nil {
		return nil, err
	}
	splits, err := s.list(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.mu.listed == nil {
		s.mu.listed = make(map[string]bool, len(splits))
	}
	for _, sp := range splits {
		s.mu.listed[sp.ID] = true
	}
	s.mu.Unlock()
	if err := s.lockQueues(ctx, splits...); err != nil {
		return nil, err
	}
	return splits, nil
}

// DiscoverSplits implements source.Discoverer: the topic's current queues,
// from a fresh route. Splits it finds that Splits did not list start at
// their min offset when they have no checkpoint.
func (s *Source) DiscoverSplits(ctx context.Context) ([]source.Split, error) {
	if err := s.connect(); err != nil {
		return nil, err
	}
	if _, err := s.c.RefreshRoute(ctx, s.topic); err != nil {
		return nil, routeError(s.topic, err)
	}
	return s.list(ctx)
}

func (s *Source) list(ctx context.Context) ([]source.Split, error) {
	r, err := s.c.Route(ctx, s.topic)
	if err != nil {
		return nil, routeError(s.topic, err)
	}
	qs := r.SubscribeQueues()
	splits := make([]source.Split, len(qs))
	for i, q := range qs {
		splits[i] = source.Split{ID: splitID(q.BrokerName, q.QueueID)}
	}
	return splits, nil
}

// Open implements source.Source: it positions a reader on split at
// restoredOffset (an encoded Offset) or, when nil, at the start position,
// and starts its fetch goroutine. It may ask the broker for offsets (bounded
// by ctx).
func (s *Source) Open(ctx context.Context, split source.Split, restoredOffset []byte) (source.SplitReader[Message], error) {
	if err := s.connect(); err != nil {
		return nil, err
	}
	if err := s.lockQueues(ctx, split); err != nil {
		return nil, err
	}
	r, err := s.open(ctx, split, restoredOffset)
	if err != nil {
		return nil, err
	}
	return withFence[Message](s, r, r.q), nil
}

// withFence wraps r to fail once its queue's lock is lost (queue locking).
func withFence[T any](s *Source, r source.SplitReader[T], q protocol.MessageQueue) source.SplitReader[T] {
	s.lk.Lock()
	ql := s.lk.q
	s.lk.Unlock()
	if ql == nil {
		return r
	}
	return &fenced[T]{SplitReader: r, locks: ql, q: q}
}

func (s *Source) open(ctx context.Context, split source.Split, restored []byte) (*reader, error) {
	brokerName, queueID, err := parseSplitID(split.ID)
	if err != nil {
		return nil, err
	}
	q := protocol.MessageQueue{Topic: s.topic, BrokerName: brokerName, QueueID: queueID}
	pos := Offset{End: -1}
	if restored != nil {
		if pos, err = DecodeOffset(restored); err != nil {
			return nil, fmt.Errorf("rocketmq source: split %s: %w", split.ID, err)
		}
	} else {
		start := s.cfg.start
		s.mu.Lock()
		discovered := s.mu.listed != nil && !s.mu.listed[split.ID]
		s.mu.Unlock()
		if discovered {
			start = Earliest()
		}
		if pos.Next, err = s.startOffset(ctx, q, split.ID, start); err != nil {
			return nil, err
		}
	}
	switch s.cfg.stop.kind {
	case stopNone, stopTimestamp:
		pos.End = -1
	case stopOffsets:
		end, ok := s.cfg.stop.offsets[split.ID]
		if !ok {
			end = pos.Next // not listed: nothing to read
		}
		pos.End = end
	case stopLatest:
		if pos.End < 0 {
			if pos.End, err = s.c.MaxOffset(ctx, q); err != nil {
				return nil, fmt.Errorf("rocketmq source: stop offset of %s: %w", split.ID, err)
			}
		}
	}
	r := newReader(s, q, split.ID, pos)
	return r, nil
}

// startOffset resolves a start position for q.
func (s *Source) startOffset(ctx context.Context, q protocol.MessageQueue, id string, p StartPosition) (int64, error) {
	var (
		off int64
		err error
	)
	switch p.kind {
	case startEarliest:
		off, err = s.c.MinOffset(ctx, q)
	case startLatest:
		off, err = s.c.MaxOffset(ctx, q)
	case startTimestamp:
		off, err = s.atTimestamp(ctx, q, p.t) // seek.go
	case startGroup:
		off, err = s.c.QueryConsumerOffset(ctx, s.cfg.group, q)
		if errors.Is(err, client.ErrNoOffset) || (err == nil && off < 0) {
			return s.startOffset(ctx, q, id, *p.fallback)
		}
	case startOffsets:
		v, ok := p.offsets[id]
		if !ok {
			return s.startOffset(ctx, q, id, *p.fallback)
		}
		return v, nil
	}
	if err != nil {
		return 0, fmt.Errorf("rocketmq source: start offset of %s: %w", id, err)
	}
	return off, nil
}

// Bytes returns the source as a source.Source[[]byte] of message bodies
// (for pipeline.FromBytes); offsets, splits and binding are the same.
func (s *Source) Bytes() source.Source[[]byte] { return bytesSource{s} }

type bytesSource struct{ s *Source }

func (b bytesSource) Bind(info jobinfo.Info) error { return b.s.Bind(info) }

func (b bytesSource) Splits(ctx context.Context) ([]source.Split, error) { return b.s.Splits(ctx) }

// Topic is the source's topic.
func (b bytesSource) Topic() string { return b.s.topic }

func (b bytesSource) DiscoverSplits(ctx context.Context) ([]source.Split, error) {
	return b.s.DiscoverSplits(ctx)
}

func (b bytesSource) Open(ctx context.Context, split source.Split, restored []byte) (source.SplitReader[[]byte], error) {
	if err := b.s.connect(); err != nil {
		return nil, err
	}
	if err := b.s.lockQueues(ctx, split); err != nil {
		return nil, err
	}
	r, err := b.s.open(ctx, split, restored)
	if err != nil {
		return nil, err
	}
	return withFence[[]byte](b.s, &bytesReader{r: r}, r.q), nil
}

// DescribeOffset describes an encoded Offset for people: "next 405" (the
// queue offset of the next message to read), "next 405 (stop at 500)";
// "" for bytes that are not an Offset. The status page shows checkpointed
// offsets with it.
func (s *Source) DescribeOffset(b []byte) string { return describeOffset(b) }

// DescribeOffset is Source.DescribeOffset.
func (b bytesSource) DescribeOffset(off []byte) string { return describeOffset(off) }

func describeOffset(b []byte) string {
	o, err := DecodeOffset(b)
	if err != nil {
		return ""
	}
	return o.String()
}

// bytesReader converts a reader's records to bodies.
type bytesReader struct {
	r    *reader
	recs []source.Record[[]byte]
}

func (b *bytesReader) Poll(ctx context.Context, max int) ([]source.Record[[]byte], error) {
	in, err := b.r.Poll(ctx, max)
	b.recs = b.recs[:0]
	for i := range in {
		b.recs = append(b.recs, source.Record[[]byte]{Value: in[i].Value.Body, EventTime: in[i].EventTime, Offset: in[i].Offset, Raw: in[i].Raw})
	}
	return b.recs, err
}

func (b *bytesReader) Offset() []byte { return b.r.Offset() }

// Lag implements source.LagReporter (see reader.Lag).
func (b *bytesReader) Lag() (int64, bool) { return b.r.Lag() }

func (b *bytesReader) NotifyCheckpointComplete(ctx context.Context, id uint64) error {
	return b.r.NotifyCheckpointComplete(ctx, id)
}

func (b *bytesReader) Close() error { return b.r.Close() }
